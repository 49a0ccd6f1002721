// Builds keel's wheel into client-vscode/bundled/, where the VSIX carries it next to install.py (the
// extension's Install keel). The wheel is built from a copy of the sources, so the checkout gets no build/
// or egg-info. Python: $KEEL_PYTHON, else the checkout's .venv, else python3 (with setuptools and wheel).
import { execFileSync } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";

const root = path.resolve(import.meta.dirname, "..");
const out = path.join(root, "client-vscode", "bundled");
const venv = path.join(root, ".venv", "bin", "python");
const python = process.env.KEEL_PYTHON ?? (fs.existsSync(venv) ? venv : "python3");
const copy = fs.mkdtempSync(path.join(os.tmpdir(), "keel-wheel-"));
try {
  for (const name of ["pyproject.toml", "README.md"]) {
    fs.copyFileSync(path.join(root, name), path.join(copy, name));
  }
  for (const name of ["protocol", "storage", "server", "agents"]) {
    fs.cpSync(path.join(root, name), path.join(copy, name), { recursive: true,
      filter: (p) => !p.includes("__pycache__") });
  }
  for (const old of fs.readdirSync(out).filter((f) => f.endsWith(".whl"))) {
    fs.rmSync(path.join(out, old));
  }
  execFileSync(python, ["-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", out, copy],
    { stdio: "inherit" });
} finally {
  fs.rmSync(copy, { recursive: true, force: true });
}
const [wheel] = fs.readdirSync(out).filter((f) => f.endsWith(".whl"));
if (wheel === undefined) {
  throw new Error(`no wheel was built into ${out}`);
}
console.log(`bundled ${path.join("client-vscode", "bundled", wheel)}`);
