//! The interval ticker's schedule: ticks on a fixed grid from the start
//! (`--interval` lines at 1 s, 2 s, ...), and after a late wake (a thread
//! starved of CPU on a busy host) the next tick is the next grid point at
//! least half a period ahead, never a catch-up tick at once nor one a
//! sliver later: that drew a line of a few microseconds, and its rate,
//! bytes over nearly no time, at millions of Tb/s (a CI run's report had
//! one, 43.748-43.748 s).

use std::time::{Duration, Instant};

/// The tick after `due` on its grid of period `every` that is at least
/// half a period after `now` (`due + every` when the tick was on time).
pub fn next_tick(due: Instant, every: Duration, now: Instant) -> Instant {
    let mut next = due + every;
    if every.is_zero() {
        return next;
    }
    if next <= now {
        let missed = (now - next).as_nanos() / every.as_nanos() + 1;
        next += every * u32::try_from(missed).unwrap_or(u32::MAX);
    }
    if next - now < every / 2 {
        next += every;
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_time_ticks_follow_the_grid_and_late_ones_skip_what_passed() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let ms = Duration::from_millis;
        // On time (or a little late): the next grid point.
        assert_eq!(next_tick(t0 + s, s, t0 + s), t0 + 2 * s);
        assert_eq!(next_tick(t0 + s, s, t0 + s + ms(300)), t0 + 2 * s);
        // Woke 2.748 s after a tick due at 1 s: the ticks at 2 and 3 s
        // passed, and 4 s is a quarter of a period away: the next is at 5 s.
        assert_eq!(next_tick(t0 + s, s, t0 + ms(3748)), t0 + 5 * s);
        assert_eq!(next_tick(t0 + s, s, t0 + ms(3400)), t0 + 4 * s);
        // Exactly on a grid point that passed: the one after.
        assert_eq!(next_tick(t0 + s, s, t0 + 3 * s), t0 + 4 * s);
        assert!(next_tick(t0 + s, s, t0 + ms(3748)) > t0 + ms(3748));
        // Woke a sliver before a grid point: not a tick 100 us later.
        assert_eq!(next_tick(t0 + s, s, t0 + ms(1999)), t0 + 3 * s);
        assert_eq!(next_tick(t0 + s, s, t0 + ms(3600)), t0 + 5 * s);
    }
}
