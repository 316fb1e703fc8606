// When a dashboard's refresh comes and the last one's answers are not all in,
// it waits for the next. Perses's auto-refresh starts every query again on its
// clock (a new time range, so new queries), whether the last ones are answered
// or not: on a store slower than the refresh, the browser's queue (six
// connections to one origin over HTTP/1.1) grows by a whole dashboard's queries
// each time, no later answer is ever drawn (each belongs to a time range the
// page has left), and a panel that had not drawn yet never does. Waiting, the
// page refreshes as often as the store answers, up to the interval asked for,
// and asks it for no more than one dashboard's queries at a time.
//
// web/build.mjs has Perses's refresh timer call refreshUnlessBusy; main.jsx
// says what busy is (its query clients fetching).
let busy = () => false;

export function refreshBusyWhen(check) {
  busy = check;
}

export function refreshUnlessBusy(refresh) {
  if (!busy()) refresh();
}
