//! The `cvslurm` executable: dispatches on argv[0] or the first argument.

fn main() {
    std::process::exit(cvslurm::cli::main(std::env::args().collect()));
}
