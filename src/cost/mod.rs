//! What the node costs: its hourly price, the spend ledger, and budgets. Pure, like `rules/`:
//! time is passed in, and nothing here does I/O.

pub mod budget;
pub mod calendar;
pub mod ledger;
pub mod price;
