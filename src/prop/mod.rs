//! `moecheck prop`: property campaigns against any implementation the registry builds — the
//! campaign itself ([`campaign`]), its report ([`report`]), its JUnit XML ([`junit`]) and
//! the command lines that reproduce a failure ([`command`]).

pub mod campaign;
pub mod command;
pub mod junit;
pub mod report;
