//! The collectors, one file each; registered in [`crate::collector::COLLECTORS`].

pub mod engine;
pub mod raid;
pub mod tcp;
