//! One tower layer per concern, outermost first: `upgrade` (plain calls to `required` tools become
//! tasks), `session` (capabilities and tool cache per session), `tasks` (record, authorise, route,
//! observe), `cancel` (single-flight `tasks/cancel`, audit facts). Each module's doc says which
//! messages it touches.

pub mod cancel;
pub mod registry;
pub mod session;
pub mod tasks;
pub mod upgrade;
