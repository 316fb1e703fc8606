//! Integration tests of `longhaul sweep`, `advise` and `report`: each test
//! starts its own `longhaul serve` on 127.0.0.1 port 0 and drives the real
//! binary. Modules in tests/science/.

// A test reads as one scenario, top to bottom: the workspace's bound on a
// function's length (clippy.toml) is for the code under test.
#![allow(clippy::too_many_lines)]

mod support;

mod science {
    pub mod advise;
    pub mod messages;
    pub mod report;
    pub mod sweep;
}
