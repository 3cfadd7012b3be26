//! Catalog benchmark (being written).
fn main() {}
