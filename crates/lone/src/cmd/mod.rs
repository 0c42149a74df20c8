pub mod bench;
mod bench_suite;
pub mod common;
pub mod run;
