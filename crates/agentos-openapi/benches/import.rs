//! Times the import of the largest fixture (the 3 MB OpenAI document). Goal: under 1 s in release.
//!
//!   cargo bench -p agentos-openapi --bench import

use std::path::Path;
use std::time::Instant;

use agentos_openapi::{ImportOptions, import};

fn main() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/openapi/openai-3.1.yaml");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let options = ImportOptions::default();
    let mut times = Vec::new();
    let mut tools = 0;
    for _ in 0..5 {
        let start = Instant::now();
        let imported = import(&bytes, &options).expect("the OpenAI document imports");
        times.push(start.elapsed());
        tools = imported.operations.len();
    }
    times.sort();
    println!(
        "import openai-3.1.yaml ({} bytes, {tools} tools): min {:?}, median {:?}, max {:?} (goal < 1 s)",
        bytes.len(),
        times[0],
        times[times.len() / 2],
        times[times.len() - 1]
    );
}
