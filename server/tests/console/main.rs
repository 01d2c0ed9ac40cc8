//! The console's HTTP behaviour, driven through the real router against a
//! real PostgreSQL database (one fresh database per test, from
//! `DATABASE_URL`).

mod helpers;

mod auth;
mod operators;
mod pages;
mod schema;
