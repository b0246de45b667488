#![allow(rustdoc::redundant_explicit_links)]
#![doc = include_str!("docs.md")]

#[rustfmt::skip]
pub mod faq;

pub mod getting_started;

pub mod cluster_control;

pub mod feature_flags;

pub mod data;

pub mod components;

pub mod protocol;

pub mod internal;

pub mod upgrade_guide;

pub mod obsolete;
