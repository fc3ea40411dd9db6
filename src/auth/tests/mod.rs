//! Tests of `auth`: keys are generated here, never committed.

mod cache;
mod keys;
mod refresh;
mod support;
mod verify;
