//! What the `nexus` binary does besides serving: [`admin`] mints and manages credentials on a
//! store, and [`quickstart`] runs the main job on one machine.

pub mod admin;
pub mod client;
pub mod people;
pub mod quickstart;
