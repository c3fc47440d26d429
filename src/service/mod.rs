//! The service, `cvslurm inventory --monitor`: the sender threads that deliver what the hooks
//! queue ([`sender`]), reconciliation with Slurm ([`reconcile`]) and the resends that follow a
//! node's changed inventory ([`resend`]).

pub mod reconcile;
pub mod resend;
pub mod sender;
