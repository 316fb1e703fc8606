//! The collectors, one file each, each a [`crate::collector::Collector`]
//! with its `SPEC`; registered in scrape.rs.

pub mod certificates;
pub mod engine;
pub mod raid;
pub mod tcp;
