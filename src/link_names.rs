//! The modes of the binary and the busybox-style names (argv\[0\]) that select them: the
//! one table [`crate::cli`] dispatches on and the check and install's Slurm facts read.

use std::path::Path;

/// Every mode, with the busybox-style names (argv[0]) that select it: the one list of modes
/// and link names. install.sh, the packages and the tests read it from `cvslurm --list-modes`.
/// The names of the earlier Python tools also come with `.py`.
pub(crate) const MODES: &[(&str, &[&str])] = &[
    ("hook", &["cvslurm-hook", "cv-job-hook", "cv-job-hook.py"]),
    ("send", &["cvslurm-send", "cv-job-send", "cv-job-send.py"]),
    (
        "inventory",
        &[
            "cvslurm-inventory",
            "cv-node-inventory",
            "cv-node-inventory.py",
        ],
    ),
    (
        "discover",
        &[
            "cvslurm-discover",
            "interface_discovery",
            "interface_discovery.py",
        ],
    ),
    ("publish", &["cvslurm-publish"]),
    ("flush", &["cvslurm-flush"]),
    ("status", &["cvslurm-status"]),
    ("check", &["cvslurm-check"]),
];

/// The mode a busybox-style argv[0] names, if any (a trailing `.py` is ignored).
pub(crate) fn mode_from_argv0(argv0: &str) -> Option<&'static str> {
    let base = Path::new(argv0).file_name()?.to_str()?;
    let base = base.strip_suffix(".py").unwrap_or(base);
    MODES
        .iter()
        .find(|(_, names)| names.contains(&base))
        .map(|(mode, _)| *mode)
}

/// True when a file name is one the cvslurm binary runs as its hook mode.
pub fn is_hook_name(name: &str) -> bool {
    !name.contains('/') && mode_from_argv0(name) == Some("hook")
}
