// When a dashboard's refresh comes and the last one's answers are not all in,
// it waits for the next. Perses's auto-refresh starts every query again on its
// clock (a new time range, so new queries), whether the last ones are answered
// or not: on a store slower than the refresh, the browser's queue (six
// connections to one origin over HTTP/1.1) grows by a whole dashboard's queries
// each time, no later answer is ever drawn (each belongs to a time range the
// page has left), and a panel that had not drawn yet never does. Waiting, the
// page refreshes at the first tick of its interval after the last answer.
//
// A query that hangs (a store that takes the connection and never answers,
// until nginx's 60 s) would hold every panel's refresh: after WAIT_AT_MOST_MS
// of waiting (or one interval, if longer) the page refreshes anyway.
//
// web/build.mjs has Perses's refresh timer call refreshUnlessBusy; main.jsx
// says what busy is (its query clients fetching).
const WAIT_AT_MOST_MS = 30000;
let busy = () => false;
let waitingSince = null;

export function refreshBusyWhen(check) {
  busy = check;
}

export function refreshUnlessBusy(refresh, intervalMs) {
  if (busy()) {
    waitingSince ??= Date.now();
    // the ticks skipped so far, and this one, within WAIT_AT_MOST_MS
    if (Date.now() - waitingSince <= Math.max(WAIT_AT_MOST_MS - intervalMs, 0)) return;
  }
  waitingSince = null;
  refresh();
}
