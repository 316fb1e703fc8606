//! `basic_auth_users`: user names and bcrypt hashes.
//!
//! bcrypt is slow on purpose (~0.1-0.3 s of a core at the usual costs
//! 10-12), so every guess a stranger sends would cost the host that much.
//! What bounds it:
//! - a scraper's right password is checked by bcrypt once, then remembered
//!   (a SHA-256 of user, password and hash, [`REMEMBERED`] at most); a
//!   wrong one too ([`REFUSED`]): repeating a guess, or a client set up with
//!   a wrong password, costs no bcrypt;
//! - each source (an IPv4 address, an IPv6 /64) may have [`GUESSES`]
//!   failed checks at once, then one a second (longhaul-admission's
//!   failed-proof budget, as the engine's login): beyond, `429` without
//!   bcrypt;
//! - one bcrypt runs at a time, and one more request may wait for it (up
//!   to [`PATIENCE`]); others get `503` at once;
//! - all that needs no bcrypt is answered by [`BasicAuth::precheck`] before
//!   the request takes a handler slot ([`guard`]'s precheck).
//!
//! So guesses hold at most two of the server's handler slots, and a
//! scraper whose password is remembered is answered however many addresses
//! guess.
//!
//! What stays: guessers at many addresses can keep the one bcrypt busy, and
//! so delay a scraper's first login after a restart (it gets `503` until
//! its turn comes); a user that does not exist is checked against a hash
//! of the highest cost in the file, so with users at different costs the
//! time of an answer tells a cheaper user from a missing one.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use longhaul_admission::{ProofBudget, ProofLimits};
use longhaul_http_serve::{Handler, Precheck, Request, Response};
use sha2::{Digest, Sha256};
use yaml_rust2::Yaml;

/// Verified credentials remembered; a scraper needs one, a few clients a
/// few. Beyond, the oldest is forgotten (and costs one bcrypt again).
pub const REMEMBERED: usize = 64;
/// Refused credentials remembered.
pub const REFUSED: usize = 256;
/// Failed checks a source may have at once; then one a second.
pub const GUESSES: u32 = 4;
/// How long a request waits for the bcrypt in progress to finish.
pub const PATIENCE: Duration = Duration::from_secs(2);
/// The highest bcrypt cost taken: one check at 14 takes ~1 s of a core.
pub const MAX_COST: u32 = 14;

/// The users and their bcrypt hashes.
pub struct BasicAuth {
    users: HashMap<String, String>,
    /// Checked when the user is unknown, for the same cost.
    decoy: String,
    verified: Mutex<VecDeque<[u8; 32]>>,
    refused: Mutex<VecDeque<[u8; 32]>>,
    guesses: Arc<ProofBudget>,
    bcrypt: Gate,
}

/// What a check of credentials found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// No credentials, or wrong ones.
    Refused,
    /// The source failed too often lately: not checked.
    SlowedDown,
    /// bcrypt was busy with others' checks: not checked.
    Busy,
}

/// `basic_auth_users`; an empty mapping means no authentication.
pub(crate) fn users(value: &Yaml) -> Result<Option<Arc<BasicAuth>>, String> {
    let mut users = HashMap::new();
    let mut cost = 0;
    for (user, hash) in crate::mapping(value, "basic_auth_users")? {
        let hash = crate::text(hash, &format!("basic_auth_users.{user}"))?;
        let c = bcrypt_cost(&hash).ok_or_else(|| {
            format!(
                "basic_auth_users.{user}: not a bcrypt hash ($2a$, $2b$ or $2y$, a cost of 4-31, 53 characters)"
            )
        })?;
        if c > MAX_COST {
            return Err(format!(
                "basic_auth_users.{user}: bcrypt cost {c} is above {MAX_COST}: each check would take \
                 seconds of a core (10-12 is usual)"
            ));
        }
        cost = cost.max(c);
        users.insert(user, hash);
    }
    if users.is_empty() {
        return Ok(None);
    }
    let decoy = bcrypt::hash("not the password of anyone", cost)
        .map_err(|e| format!("basic_auth_users: cannot make a hash of cost {cost}: {e}"))?;
    Ok(Some(Arc::new(BasicAuth {
        users,
        decoy,
        verified: Mutex::default(),
        refused: Mutex::default(),
        guesses: ProofBudget::new(ProofLimits {
            burst: GUESSES,
            per_second: 1.0,
        }),
        bcrypt: Gate::default(),
    })))
}

/// A bcrypt hash's cost, if `hash` has the form of one.
fn bcrypt_cost(hash: &str) -> Option<u32> {
    let rest = hash
        .strip_prefix("$2a$")
        .or_else(|| hash.strip_prefix("$2b$"))
        .or_else(|| hash.strip_prefix("$2y$"))?;
    let (cost, salt_and_hash) = rest.split_once('$')?;
    let cost: u32 = cost.parse().ok().filter(|c| (4..=31).contains(c))?;
    let alphabet = |b: u8| b.is_ascii_alphanumeric() || b == b'.' || b == b'/';
    (cost.to_string().len() <= 2
        && salt_and_hash.len() == 53
        && salt_and_hash.bytes().all(alphabet))
    .then_some(cost)
}

/// Credentials as read from a header: the password, the hash to check it
/// against, whether the user exists, and the key they are remembered by.
struct Presented<'a> {
    password: String,
    hash: &'a str,
    known: bool,
    key: [u8; 32],
}

impl BasicAuth {
    fn presented(&self, authorization: Option<&str>) -> Option<Presented<'_>> {
        let (user, password) = authorization.and_then(credentials)?;
        let (hash, known) = match self.users.get(&user) {
            Some(h) => (h.as_str(), true),
            None => (self.decoy.as_str(), false),
        };
        let mut key = Sha256::new();
        for part in [user.as_bytes(), password.as_bytes(), hash.as_bytes()] {
            key.update((part.len() as u64).to_le_bytes());
            key.update(part);
        }
        Some(Presented {
            password,
            hash,
            known,
            key: key.finalize().into(),
        })
    }

    /// What is known without bcrypt: the verdict on credentials missing or
    /// remembered wrong, on a source slowed down, on bcrypt too busy;
    /// `None` when only bcrypt can tell, or when they are remembered right
    /// (the request goes on to its handler, whose [`BasicAuth::check`]
    /// lets it in). Takes nothing: it runs on the server's own thread
    /// before a handler slot is taken ([`longhaul_http_serve::Precheck`]).
    pub fn precheck(&self, authorization: Option<&str>, from: std::net::IpAddr) -> Option<Verdict> {
        let Some(p) = self.presented(authorization) else {
            return Some(Verdict::Refused);
        };
        if p.known && lock(&self.verified).contains(&p.key) {
            return None;
        }
        if lock(&self.refused).contains(&p.key) {
            return Some(Verdict::Refused);
        }
        if self.guesses.would_wait(from) {
            return Some(Verdict::SlowedDown);
        }
        if self.bcrypt.full() {
            return Some(Verdict::Busy);
        }
        None
    }

    /// Whether an `Authorization` header's value, sent from `from`, names a
    /// user and their password.
    pub fn check(&self, authorization: Option<&str>, from: std::net::IpAddr) -> Verdict {
        let Some(Presented {
            password,
            hash,
            known,
            key,
        }) = self.presented(authorization)
        else {
            return Verdict::Refused;
        };
        if known && lock(&self.verified).contains(&key) {
            return Verdict::Allowed;
        }
        if lock(&self.refused).contains(&key) {
            return Verdict::Refused;
        }
        let Some(turn) = self.guesses.turn(from, Instant::now()) else {
            return Verdict::SlowedDown;
        };
        let Some(_running) = self.bcrypt.enter(PATIENCE) else {
            turn.passed();
            return Verdict::Busy;
        };
        let right = bcrypt::verify(&password, hash).unwrap_or(false) && known;
        let (list, bound) = if right {
            turn.passed();
            (&self.verified, REMEMBERED)
        } else {
            (&self.refused, REFUSED)
        };
        let mut list = lock(list);
        if list.len() >= bound {
            list.pop_front();
        }
        list.push_back(key);
        if right {
            Verdict::Allowed
        } else {
            Verdict::Refused
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One bcrypt at a time, and one request waiting for it.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    free: Condvar,
}

#[derive(Default)]
struct GateState {
    running: bool,
    waiting: bool,
}

/// The bcrypt turn; the next one's when dropped.
struct Running<'a>(&'a Gate);

impl Gate {
    /// Whether a bcrypt runs and another request waits for it.
    fn full(&self) -> bool {
        let s = lock(&self.state);
        s.running && s.waiting
    }

    /// The turn, at once or after waiting up to `patience` (None: another
    /// request waits already, or the turn did not come in time).
    fn enter(&self, patience: Duration) -> Option<Running<'_>> {
        let mut s = lock(&self.state);
        if !s.running {
            s.running = true;
            return Some(Running(self));
        }
        if s.waiting {
            return None;
        }
        s.waiting = true;
        let (mut s, _) = self
            .free
            .wait_timeout_while(s, patience, |s| s.running)
            .unwrap_or_else(|e| e.into_inner());
        s.waiting = false;
        if s.running {
            return None;
        }
        s.running = true;
        Some(Running(self))
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        lock(&self.0.state).running = false;
        self.0.free.notify_one();
    }
}

/// User and password of a `Basic` header value.
fn credentials(value: &str) -> Option<(String, String)> {
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

/// The answer to credentials that do not get in.
fn refusal(verdict: Verdict) -> Response {
    match verdict {
        Verdict::Allowed | Verdict::Refused => Response::text(401, "Unauthorized\n")
            .with_header("WWW-Authenticate", "Basic realm=\"longhaul\""),
        Verdict::SlowedDown => Response::text(
            429,
            "too many failed logins from this address; one more a second\n",
        )
        .with_header("Retry-After", "1"),
        Verdict::Busy => Response::text(503, "busy checking other logins; try again\n")
            .with_header("Retry-After", "1"),
    }
}

/// `handler` behind `auth`, and the precheck that turns strangers away
/// before they take a handler slot: without the right credentials, `401`
/// with a `WWW-Authenticate` challenge (or `429`/`503`, see the module),
/// and the handler is not called.
pub fn guard(auth: Option<Arc<BasicAuth>>, handler: Handler) -> (Handler, Option<Precheck>) {
    let Some(auth) = auth else {
        return (handler, None);
    };
    let early = auth.clone();
    let precheck: Precheck = Arc::new(move |req: &Request| {
        early
            .precheck(req.header("authorization"), req.peer.ip())
            .map(refusal)
    });
    let guarded: Handler = Arc::new(move |req: &Request| {
        match auth.check(req.header("authorization"), req.peer.ip()) {
            Verdict::Allowed => handler(req),
            other => refusal(other),
        }
    });
    (guarded, Some(precheck))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    fn header(user: &str, password: &str) -> String {
        let raw = format!("{user}:{password}");
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }

    fn auth(users: &[(&str, &str)]) -> Arc<BasicAuth> {
        let yaml: String = users
            .iter()
            .map(|(u, p)| format!("{u}: '{}'\n", bcrypt::hash(p, 4).unwrap()))
            .collect();
        let doc = &yaml_rust2::YamlLoader::load_from_str(&yaml).unwrap()[0];
        super::users(doc).unwrap().unwrap()
    }

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, n])
    }

    #[test]
    fn only_the_right_password_of_a_known_user_passes() {
        let a = auth(&[("prometheus", "s3cret:with colon"), ("other", "x")]);
        let right = header("prometheus", "s3cret:with colon");
        assert_eq!(a.check(Some(&right), ip(1)), Verdict::Allowed);
        // Remembered now, and still right.
        assert_eq!(a.check(Some(&right), ip(1)), Verdict::Allowed);
        let wrong = [
            header("prometheus", "s3cret"),
            header("prometheus", "x"),
            header("nobody", "x"),
            // The decoy's password under a user that does not exist.
            header("nobody", "not the password of anyone"),
            header("", ""),
            "Bearer abc".to_string(),
            "Basic !!!".to_string(),
        ];
        for (n, h) in wrong.iter().enumerate() {
            assert_eq!(a.check(Some(h), ip(10 + n as u8)), Verdict::Refused, "{h}");
        }
        assert_eq!(a.check(None, ip(2)), Verdict::Refused);
        assert_eq!(
            a.check(Some(&header("other", "x")), ip(3)),
            Verdict::Allowed
        );
        // Lower-case scheme, as RFC 7617 allows.
        let lower = header("other", "x").replacen("Basic", "basic", 1);
        assert_eq!(a.check(Some(&lower), ip(3)), Verdict::Allowed);
    }

    #[test]
    fn a_remembered_password_lets_in_only_its_own_user() {
        let a = auth(&[("alice", "same"), ("bob", "other")]);
        assert_eq!(
            a.check(Some(&header("alice", "same")), ip(1)),
            Verdict::Allowed
        );
        assert_eq!(
            a.check(Some(&header("bob", "same")), ip(1)),
            Verdict::Refused
        );
        assert_eq!(
            a.check(Some(&header("alic", "esame")), ip(2)),
            Verdict::Refused
        );
    }

    #[test]
    fn a_guessing_source_is_slowed_down_and_others_are_not() {
        let a = auth(&[("prometheus", "right")]);
        let scraper = header("prometheus", "right");
        assert_eq!(a.check(Some(&scraper), ip(2)), Verdict::Allowed);
        for n in 0..GUESSES {
            let guess = header("prometheus", &format!("guess{n}"));
            assert_eq!(a.check(Some(&guess), ip(2)), Verdict::Refused);
        }
        let more = header("prometheus", "guess-more");
        assert_eq!(a.check(Some(&more), ip(2)), Verdict::SlowedDown);
        // The same guess again costs nothing: refused, not slowed down.
        let again = header("prometheus", "guess0");
        assert_eq!(a.check(Some(&again), ip(2)), Verdict::Refused);
        // Another address has its own budget; the remembered password
        // still passes from the guessing one.
        assert_eq!(a.check(Some(&more), ip(3)), Verdict::Refused);
        assert_eq!(a.check(Some(&scraper), ip(2)), Verdict::Allowed);
        // A second on, one more try.
        std::thread::sleep(Duration::from_millis(1100));
        let later = header("prometheus", "guess-later");
        assert_eq!(a.check(Some(&later), ip(2)), Verdict::Refused);
    }

    #[test]
    fn the_precheck_tells_what_needs_no_bcrypt_and_takes_nothing() {
        let a = auth(&[("prometheus", "right")]);
        let right = header("prometheus", "right");
        assert_eq!(a.precheck(None, ip(1)), Some(Verdict::Refused));
        assert_eq!(a.precheck(Some("Bearer x"), ip(1)), Some(Verdict::Refused));
        // Not known yet: only bcrypt can tell.
        assert_eq!(a.precheck(Some(&right), ip(1)), None);
        assert_eq!(a.check(Some(&right), ip(1)), Verdict::Allowed);
        assert_eq!(a.precheck(Some(&right), ip(1)), None);
        // A wrong password, once refused, is refused without bcrypt.
        let wrong = header("prometheus", "wrong");
        assert_eq!(a.precheck(Some(&wrong), ip(2)), None);
        assert_eq!(a.check(Some(&wrong), ip(2)), Verdict::Refused);
        assert_eq!(a.precheck(Some(&wrong), ip(2)), Some(Verdict::Refused));
        // A source out of failed checks is slowed down; the precheck took
        // none of its tokens (only checks do).
        for n in 1..GUESSES {
            let guess = header("prometheus", &format!("guess{n}"));
            assert_eq!(a.precheck(Some(&guess), ip(2)), None);
            assert_eq!(a.check(Some(&guess), ip(2)), Verdict::Refused);
        }
        let more = header("prometheus", "more");
        assert_eq!(a.precheck(Some(&more), ip(2)), Some(Verdict::SlowedDown));
        assert_eq!(a.precheck(Some(&more), ip(3)), None);
        // bcrypt running with one waiting: busy, for a new password only.
        let _running = a.bcrypt.enter(PATIENCE).unwrap();
        lock(&a.bcrypt.state).waiting = true;
        assert_eq!(a.precheck(Some(&more), ip(3)), Some(Verdict::Busy));
        assert_eq!(a.precheck(Some(&right), ip(3)), None);
        lock(&a.bcrypt.state).waiting = false;
    }

    #[test]
    fn one_bcrypt_runs_and_one_request_waits() {
        let gate = Arc::new(Gate::default());
        let first = gate.enter(PATIENCE).expect("an idle gate lets in");
        let waiter = {
            let gate = gate.clone();
            std::thread::spawn(move || gate.enter(Duration::from_secs(5)).is_some())
        };
        // The waiter is waiting: a third is turned away at once.
        let t = Instant::now();
        while !lock(&gate.state).waiting {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the waiter never waited"
            );
            std::thread::yield_now();
        }
        let t = Instant::now();
        assert!(gate.enter(Duration::from_secs(5)).is_none());
        assert!(t.elapsed() < Duration::from_secs(1));
        drop(first);
        assert!(waiter.join().unwrap(), "the waiter did not get the turn");
        // Not in time: None after the patience.
        let held = gate.enter(PATIENCE).unwrap();
        let t = Instant::now();
        let gate2 = gate.clone();
        let late = std::thread::spawn(move || gate2.enter(Duration::from_millis(200)).is_none());
        assert!(late.join().unwrap());
        assert!(t.elapsed() >= Duration::from_millis(200));
        drop(held);
    }

    #[test]
    fn hashes_that_are_not_bcrypt_or_too_costly_are_refused_by_user() {
        let tail = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0";
        for (bad, says) in [
            ("plain".to_string(), "not a bcrypt hash"),
            ("$2b$12$short".to_string(), "not a bcrypt hash"),
            (
                "$1$abcdefgh$0123456789012345678901".to_string(),
                "not a bcrypt hash",
            ),
            (format!("$2b$99${tail}"), "not a bcrypt hash"),
            (format!("$2b$15${tail}"), "bcrypt cost 15 is above 14"),
        ] {
            let doc =
                &yaml_rust2::YamlLoader::load_from_str(&format!("alice: '{bad}'\n")).unwrap()[0];
            let e = super::users(doc).err().unwrap();
            assert!(
                e.contains(&format!("basic_auth_users.alice: {says}")),
                "{bad}: {e}"
            );
        }
    }
}
