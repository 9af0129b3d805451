//! Embeds every `templates/*.yaml` into the binary, so the default templates the kustomization turns
//! into the ConfigMap are the same ones `inject` and a cluster-less `serve` use.

use std::{env, fs, path::Path};

fn main() {
    let dir = Path::new(&env::var("CARGO_MANIFEST_DIR").unwrap()).join("../../templates");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut entries: Vec<_> = fs::read_dir(&dir)
        .expect("templates/ exists")
        .map(|e| e.expect("readable templates/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    entries.sort();
    let mut code = String::from("[\n");
    for path in entries {
        println!("cargo:rerun-if-changed={}", path.display());
        let name = path.file_stem().unwrap().to_str().expect("UTF-8 template file name");
        code.push_str(&format!("    ({name:?}, include_str!({:?})),\n", path.display().to_string()));
    }
    code.push(']');
    fs::write(Path::new(&env::var("OUT_DIR").unwrap()).join("embedded_templates.rs"), code).unwrap();
}
