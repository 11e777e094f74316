//! One tower layer per concern, outermost first: `upgrade` (plain calls to `required` tools become
//! tasks), `session` (capabilities and tool cache per session), `tasks` (record, authorise, route,
//! observe), `cancel` (single-flight `tasks/cancel`, audit facts). Each module's doc says which
//! messages it touches. The task registry they share is [`crate::registry`] (not a layer).

pub mod cancel;
pub mod extensions;
pub mod observe;
pub mod session;
pub mod tasks;
pub mod upgrade;

#[cfg(test)]
pub(crate) mod testing;

/// The registry used to live here; it is [`crate::registry`] now. This alias keeps the path the
/// integration-test harness names (`taskgate::layers::registry::Registry`) until that harness
/// moves to `crate::registry`.
#[doc(hidden)]
pub use crate::registry;
