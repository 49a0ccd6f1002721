/**
 * Which Python runs `keel serve`, and whether keel is installed for it.
 *
 * The discovery chain follows the Python tools extension template: the `keel.python` setting, else keel's
 * own environment (made by Install keel from the wheel the VSIX carries), else the interpreter selected in
 * the Python extension (through its public API, when that extension is present), else `python3` on PATH.
 * Must not depend on the language client.
 */
import { execFile } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";
import * as vscode from "vscode";
import { PythonExtension } from "@vscode/python-extension";

export interface Interpreter {
  /** The executable to run (an absolute path, or a name looked up on PATH). */
  command: string;
  /** Where it came from, for the log and error messages. */
  source: "setting" | "keel's environment" | "python extension" | "PATH";
}

/** keel's own environment: a venv under the extension's global storage, and the script the VSIX carries
 * (client-vscode/bundled/install.py, next to keel's wheel) that makes it. */
export interface KeelHome {
  envDir: string;
  python: string;
  installer: string;
}

export function keelHome(context: vscode.ExtensionContext): KeelHome {
  const envDir = path.join(context.globalStorageUri.fsPath, "python-env");
  const python = path.join(envDir, process.platform === "win32" ? "Scripts/python.exe" : "bin/python");
  return { envDir, python, installer: path.join(context.extensionPath, "client-vscode", "bundled", "install.py") };
}

export async function resolveInterpreter(folder: vscode.WorkspaceFolder | undefined, log: vscode.LogOutputChannel,
                                         home: KeelHome): Promise<Interpreter> {
  const configured = vscode.workspace.getConfiguration("keel", folder).get<string>("python", "").trim();
  if (configured !== "") {
    return { command: expandVariables(configured, folder), source: "setting" };
  }
  if (fs.existsSync(home.python)) {
    return { command: home.python, source: "keel's environment" };
  }
  const fromExtension = await interpreterFromPythonExtension(folder, log);
  if (fromExtension !== undefined) {
    return { command: fromExtension, source: "python extension" };
  }
  return { command: "python3", source: "PATH" };
}

export interface Candidate {
  /** ".venv", "venv", "Python extension": what a button says. */
  label: string;
  python: string;
}

const WORKSPACE_ENVS = [[".venv", ".venv/bin/python"], ["venv", "venv/bin/python"], [".venv", ".venv/Scripts/python.exe"],
  ["venv", "venv/Scripts/python.exe"]] as const;

/** The workspace's virtual environments (.venv, venv) and the Python extension's chosen interpreter,
 * those that exist, without repeats. */
export async function candidateInterpreters(folder: vscode.WorkspaceFolder | undefined,
                                            log: vscode.LogOutputChannel): Promise<Candidate[]> {
  const found: Candidate[] = [];
  for (const [label, rel] of WORKSPACE_ENVS) {
    const full = folder === undefined ? "" : path.join(folder.uri.fsPath, rel);
    if (full !== "" && fs.existsSync(full)) {
      found.push({ label, python: full });
    }
  }
  const chosen = await interpreterFromPythonExtension(folder, log);
  if (chosen !== undefined && !found.some((c) => c.python === chosen)) {
    found.push({ label: "the Python extension's interpreter", python: chosen });
  }
  return found;
}

/** Subscribe to interpreter changes in the Python extension (when it is installed). */
export async function onPythonInterpreterChanged(listener: () => void): Promise<vscode.Disposable | undefined> {
  if (vscode.extensions.getExtension("ms-python.python") === undefined) {
    return undefined;
  }
  const api = await PythonExtension.api();
  return api.environments.onDidChangeActiveEnvironmentPath(() => listener());
}

async function interpreterFromPythonExtension(folder: vscode.WorkspaceFolder | undefined,
                                              log: vscode.LogOutputChannel): Promise<string | undefined> {
  if (vscode.extensions.getExtension("ms-python.python") === undefined) {
    return undefined;
  }
  try {
    const api = await PythonExtension.api();
    const active = api.environments.getActiveEnvironmentPath(folder?.uri);
    const env = await api.environments.resolveEnvironment(active);
    return env?.executable.uri?.fsPath;
  } catch (err) {
    log.warn(`could not ask the Python extension for its interpreter: ${String(err)}`);
    return undefined;
  }
}

function expandVariables(value: string, folder: vscode.WorkspaceFolder | undefined): string {
  const home = process.env["HOME"] ?? "";
  return value
    .replace(/\$\{workspaceFolder\}/g, folder?.uri.fsPath ?? "")
    .replace(/\$\{userHome\}/g, home)
    .replace(/^~(?=\/)/, home);
}

export type KeelCheck = { ok: true } | { ok: false; reason: string };

/** Run `<python> -c "import keel.server"`: the one check that the server can start at all. */
export function checkKeelInstalled(python: string, cwd: string | undefined): Promise<KeelCheck> {
  return new Promise((resolve) => {
    execFile(python, ["-c", "import keel.server"], { cwd, timeout: 30_000 }, (error, _stdout, stderr) => {
      if (error === null) {
        resolve({ ok: true });
        return;
      }
      const code = (error as NodeJS.ErrnoException).code;
      const reason = code === "ENOENT" ? `${python} was not found` : lastLine(stderr) || error.message;
      resolve({ ok: false, reason });
    });
  });
}

/** The one command that installs keel into its own environment (keelHome) with this interpreter (3.11+):
 * the VSIX's install.py makes the venv and installs the wheel it carries (dependencies from pip's index). */
export function installCommand(python: string, home: KeelHome): string {
  return [python, home.installer, home.envDir].map(quote).join(" ");
}

function quote(word: string): string {
  return /[\s"'$&;|()<>]/.test(word) ? `"${word.replace(/(["$`\\])/g, "\\$1")}"` : word;
}

function lastLine(text: string): string {
  const lines = text.trim().split("\n");
  return lines[lines.length - 1] ?? "";
}
