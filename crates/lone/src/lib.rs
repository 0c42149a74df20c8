//! The `lone` command's modules, as a library: the binary (`main.rs`) is argument parsing and
//! dispatch over them, and the fuzz targets reach the server's request parsing through here.

pub mod cli;
pub mod cmd;
pub mod hub;
pub mod serve;
