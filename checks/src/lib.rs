//! `mpib-checks`: the repository's own checks, as tests (`cargo test -p mpib-checks`):
//!
//! * `tests/dashboards.rs`: every dashboard query and alert rule names metrics and labels the
//!   collector's and the agent's catalogs have (read from the crates themselves), the rules pass
//!   `promtool check rules` and their unit tests.
//! * `tests/doc_references.rs`: every repository path a document or comment cites exists.
//! * `tests/params_doc.rs`: the README's variable table is `mpib_params::params::PARAMS`.
//!
//! Nothing here ships; the crate has no code of its own.
