//! What the `nexus` binary does besides serving: [`admin`] mints and manages credentials on a
//! store, [`quickstart`] runs the main job on one machine, and [`people`] is the command line
//! for people, a client of the doors ([`client`]).

pub mod admin;
pub mod client;
mod follow;
pub mod people;
pub mod quickstart;
