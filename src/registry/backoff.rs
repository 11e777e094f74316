//! The waits between the tries of a refused final write: a gateway task's
//! (`layers::gateway_tasks`), an upgraded call's (`layers::upgrade::follower`) and a terminal
//! status report the registry kept ([`super::refused`]). In the registry because the registry
//! uses it too, and layers import the registry, never the reverse.

use std::time::Duration;

/// The first wait before a refused final write is tried again; it doubles up to
/// [`FINAL_WRITE_MAX_WAIT`].
pub const FINAL_WRITE_FIRST_WAIT: Duration = Duration::from_millis(100);
/// The longest wait between two tries of a refused final write.
pub const FINAL_WRITE_MAX_WAIT: Duration = Duration::from_secs(5);

/// The waits between the tries of one refused final write: [`FINAL_WRITE_FIRST_WAIT`] doubling
/// up to [`FINAL_WRITE_MAX_WAIT`], each jittered to half to all of it, so writes refused together
/// are not tried again together.
#[derive(Debug)]
pub struct FinalWriteBackoff {
    wait: Duration,
}

impl Default for FinalWriteBackoff {
    fn default() -> Self {
        FinalWriteBackoff {
            wait: FINAL_WRITE_FIRST_WAIT,
        }
    }
}

impl FinalWriteBackoff {
    /// Sleeps the next wait, at most `left` (what is left of the task's ttl).
    pub async fn sleep(&mut self, left: Duration) {
        tokio::time::sleep(self.next_wait().min(left)).await;
    }

    /// The next wait (jittered), the one after it doubled (up to [`FINAL_WRITE_MAX_WAIT`]).
    pub fn next_wait(&mut self) -> Duration {
        let jittered = self.wait.mul_f64(0.5 + fastrand::f64() / 2.0);
        self.wait = (self.wait * 2).min(FINAL_WRITE_MAX_WAIT);
        jittered
    }

    /// Back to [`FINAL_WRITE_FIRST_WAIT`] (the store took a write).
    pub fn reset(&mut self) {
        self.wait = FINAL_WRITE_FIRST_WAIT;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_waits_double_up_to_the_cap_jittered() {
        let mut b = FinalWriteBackoff::default();
        let mut full = FINAL_WRITE_FIRST_WAIT;
        for _ in 0..10 {
            let w = b.next_wait();
            assert!(
                w >= full / 2 && w <= full,
                "{w:?} within half to all of {full:?}"
            );
            full = (full * 2).min(FINAL_WRITE_MAX_WAIT);
        }
        assert_eq!(full, FINAL_WRITE_MAX_WAIT);
        b.reset();
        assert!(b.next_wait() <= FINAL_WRITE_FIRST_WAIT);
    }
}
