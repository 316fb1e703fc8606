//! Integration tests of `longhaul sweep`, `advise` and `report`: each test
//! starts its own `longhaul serve` on 127.0.0.1 port 0 and drives the real
//! binary. Modules in tests/science/.

mod support;

mod science {
    pub mod advise;
    pub mod messages;
    pub mod report;
    pub mod sweep;
}
