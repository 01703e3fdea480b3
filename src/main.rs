fn main() {
    std::process::exit(pdinject::cli::main());
}
