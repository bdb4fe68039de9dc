//! The messages and services generated from `proto/railguard.proto`
//! (package `railguard.v1`).

#![allow(clippy::all, missing_docs, rustdoc::all)]

tonic::include_proto!("railguard.v1");
