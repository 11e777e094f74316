//! One tower layer per concern, outermost first: `tasks` (record, authorise, route, observe),
//! `cancel` (single-flight `tasks/cancel`, audit facts). Each module's doc says which messages it
//! touches.

pub mod cancel;
pub mod tasks;
