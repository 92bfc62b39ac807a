//! The app's end-to-end tests in one binary: each integration-test binary
//! links the whole stack, so one binary builds in a fraction of the time of
//! four. The process-level tests share the cores through
//! [`common::cores_shared`] and [`common::cores_alone`].

mod common;
mod fraud;
mod gui;
mod lifecycle;
mod package;
