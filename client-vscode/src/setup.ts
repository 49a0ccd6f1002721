/**
 * First run: the commands the Missions view's welcome offers while keel cannot start — install keel (in a
 * terminal: the found interpreter, 3.11+, makes keel's own environment from the wheel the VSIX carries),
 * or choose another interpreter. Must not draw views.
 *
 * `keel.python` is `machine-overridable`: it names a path on the machine keel runs on, so it must not
 * sync to other machines, and a workspace may override it. In a remote window (code-server, Remote-SSH)
 * such a setting lives in the Remote settings, not the User ones; Choose Interpreter therefore writes
 * the choice to the workspace settings itself, and its "Open Setting" entry opens the tab where the
 * setting really is.
 */
import * as vscode from "vscode";
import type { KeelConnection } from "./connection";
import { candidateInterpreters, installCommand, type KeelHome, resolveInterpreter } from "./interpreter";

export function registerSetup(connection: KeelConnection, log: vscode.LogOutputChannel,
                              home: KeelHome): vscode.Disposable[] {
  return [
    vscode.commands.registerCommand("keel.installServer", async () => {
      const folder = vscode.workspace.workspaceFolders?.[0];
      const python = connection.interpreter?.command ?? (await resolveInterpreter(folder, log, home)).command;
      const terminal = vscode.window.createTerminal({ name: "keel install", cwd: folder?.uri });
      const closed = vscode.window.onDidCloseTerminal(async (t) => {
        if (t !== terminal) {
          return;
        }
        closed.dispose();
        const configured = vscode.workspace.getConfiguration("keel", folder).get<string>("python", "").trim();
        if (t.exitStatus?.code === 0 && configured !== "" && configured !== home.python) {
          log.info(`keel is installed in ${home.envDir}: keel.python now names its interpreter`);
          await useInterpreter(home.python); // the server restarts on the settings change
          return;
        }
        log.info("the install terminal closed: starting the server again");
        void connection.restart();
      });
      terminal.show();
      log.info(`installing keel: ${installCommand(python, home)}`);
      terminal.sendText(`${installCommand(python, home)} && exit`);
    }),
    vscode.commands.registerCommand("keel.copyInstallCommand", async () => {
      const python = connection.interpreter?.command ?? "python3";
      await vscode.env.clipboard.writeText(installCommand(python, home));
    }),
    vscode.commands.registerCommand("keel.chooseInterpreter", () => chooseInterpreter(log)),
    vscode.commands.registerCommand("keel.useInterpreter", (python: string) => useInterpreter(python)),
  ];
}

interface Choice extends vscode.QuickPickItem {
  python?: string;
  action?: "enter" | "settings";
}

/** Pick an interpreter (the workspace's .venv, python3 on PATH, or a path typed in) and save it as the
 * workspace's `keel.python`; the server restarts on the settings change. */
export async function chooseInterpreter(log: vscode.LogOutputChannel): Promise<string | undefined> {
  const folder = vscode.workspace.workspaceFolders?.[0];
  const items: Choice[] = (await candidateInterpreters(folder, log)).map((c) => ({
    label: vscode.workspace.asRelativePath(c.python), description: c.label, python: c.python,
  }));
  items.push({ label: "python3", description: "first on PATH", python: "python3" });
  items.push({ label: "$(edit) Enter an interpreter path…", action: "enter" });
  items.push({ label: "$(settings-gear) Open the keel.python setting", action: "settings",
    description: vscode.env.remoteName ? "Remote settings" : "User settings" });
  const pick = await vscode.window.showQuickPick(items, { title: "keel: choose the Python interpreter that has keel" });
  if (pick === undefined) {
    return undefined;
  }
  if (pick.action === "settings") {
    // a machine-scoped setting of a remote window is edited in the Remote settings
    await vscode.commands.executeCommand(vscode.env.remoteName ? "workbench.action.openRemoteSettings"
      : "workbench.action.openSettings", { query: "keel.python" });
    return undefined;
  }
  const python = pick.python ?? await vscode.window.showInputBox({ title: "keel: interpreter path",
    prompt: "The Python executable that has keel installed", placeHolder: "/path/to/python" });
  if (python === undefined || python.trim() === "") {
    return undefined;
  }
  return useInterpreter(python.trim());
}

/** Save `python` as the workspace's keel.python (the server restarts on the change). */
export async function useInterpreter(python: string): Promise<string> {
  const folder = vscode.workspace.workspaceFolders?.[0];
  const target = folder === undefined ? vscode.ConfigurationTarget.Global : vscode.ConfigurationTarget.Workspace;
  await vscode.workspace.getConfiguration("keel").update("python", python, target);
  return python;
}
