/**
 * The connection to `keel serve`: find the interpreter, check keel is installed, run the language client,
 * restart it on demand. Its lifecycle is an explicit state machine (enum, transition table, one
 * `setState`). Must not depend on the views: they listen to `onDidChangeState` and the mission model.
 */
import * as path from "node:path";
import * as readline from "node:readline";
import * as vscode from "vscode";
import {
  ExecuteCommandRequest,
  LanguageClient,
  MessageType,
  ShowMessageNotification,
  State,
  CloseAction,
  ErrorAction,
  type ErrorHandler,
  type DynamicFeature,
  type Executable,
  type ClientCapabilities,
  type LanguageClientOptions,
  type StaticFeature,
} from "vscode-languageclient/node";
import {
  candidateInterpreters, checkKeelInstalled, installCommand, type Interpreter, type KeelHome, resolveInterpreter,
} from "./interpreter";
import { Notifications, type ActivityChanged, type MissionSummary, type ProvidersPayload } from "./protocol";

const MAX_RESTARTS = 3;
const RESTART_WINDOW_MS = 3 * 60_000;

export enum ConnectionState {
  Stopped = "stopped",
  Starting = "starting",
  Running = "running",
  NotInstalled = "not installed",
  Failed = "failed",
}

const S = ConnectionState;
const TRANSITIONS: Record<ConnectionState, readonly ConnectionState[]> = {
  [S.Stopped]: [S.Starting],
  [S.Starting]: [S.Running, S.NotInstalled, S.Failed, S.Stopped],
  [S.Running]: [S.Stopped, S.Failed],
  [S.NotInstalled]: [S.Starting, S.Stopped],
  [S.Failed]: [S.Starting, S.Stopped],
};

/**
 * The server advertises its commands (keel.pause …) through executeCommandProvider; the stock client
 * would register VS Code commands with those ids, which the extension registers itself (with pickers and
 * input boxes). Dropping that one feature keeps one owner per command id; requests are sent directly.
 */
class KeelLanguageClient extends LanguageClient {
  public override registerFeature(feature: StaticFeature | DynamicFeature<unknown>): void {
    const method = (feature as Partial<DynamicFeature<unknown>>).registrationType?.method;
    if (method === ExecuteCommandRequest.method) {
      return;
    }
    super.registerFeature(feature);
  }
}

/**
 * The status-bar item (statusBar.ts) already shows the mission that runs; the language client would add
 * a second item for the server's `$/progress`. Registered after the client's own features, this one
 * withdraws `window.workDoneProgress`, so the server sends no progress to this client.
 */
const noWindowProgress: StaticFeature = {
  getState: () => ({ kind: "static" }),
  fillClientCapabilities: (capabilities: ClientCapabilities) => {
    capabilities.window = { ...capabilities.window, workDoneProgress: false };
  },
  initialize: () => undefined,
  clear: () => undefined,
};

/** The server's own toast for a free-text question (features/questions.py, for editors without keel's
 * plugin); this extension shows its own, with an Answer button (notify.ts). */
const FREE_TEXT_QUESTION = / asks: .* — answer with the keel\.answer command/;

export class KeelConnection implements vscode.Disposable {
  private state = ConnectionState.Stopped;
  private client: LanguageClient | undefined;
  private queue: Promise<void> = Promise.resolve();
  private readonly stateEmitter = new vscode.EventEmitter<ConnectionState>();
  private readonly changeEmitter = new vscode.EventEmitter<MissionSummary>();
  private readonly providersEmitter = new vscode.EventEmitter<ProvidersPayload>();
  /** Fires after every state change, with the new state. */
  readonly onDidChangeState = this.stateEmitter.event;
  /** Fires for every `keel/missionChanged` notification. */
  readonly onDidChangeMission = this.changeEmitter.event;
  /** Fires for every `keel/providersChanged` notification. */
  readonly onDidChangeProviders = this.providersEmitter.event;
  private readonly activityEmitter = new vscode.EventEmitter<ActivityChanged>();
  /** Fires for every `keel/activityChanged` notification. */
  readonly onDidChangeActivity = this.activityEmitter.event;
  interpreter: Interpreter | undefined;
  /** The command line of the running server (for the log and the tests). */
  serverCommand: string[] = [];
  problem = "";

  constructor(private readonly log: vscode.LogOutputChannel, private readonly home: KeelHome) {}

  get current(): ConnectionState {
    return this.state;
  }

  /** Start, stop and restart run one after another, never interleaved. */
  start(): Promise<void> {
    return this.serialize(() => this.doStart());
  }

  stop(): Promise<void> {
    return this.serialize(() => this.doStop());
  }

  restart(): Promise<void> {
    return this.serialize(async () => {
      await this.doStop();
      await this.doStart();
    });
  }

  async request<R>(method: string, params?: object): Promise<R> {
    return (await this.running()).sendRequest<R>(method, params ?? {});
  }

  async executeCommand<R>(command: string, args: unknown[]): Promise<R> {
    const client = await this.running();
    return (await client.sendRequest(ExecuteCommandRequest.type, { command, arguments: args })) as R;
  }

  dispose(): void {
    void this.stop();
    this.stateEmitter.dispose();
    this.changeEmitter.dispose();
    this.providersEmitter.dispose();
  }

  private async running(): Promise<LanguageClient> {
    await this.queue;
    if (this.client === undefined || this.state !== ConnectionState.Running) {
      throw new Error(`the keel server is ${this.state}${this.problem ? `: ${this.problem}` : ""}`);
    }
    return this.client;
  }

  private serialize(step: () => Promise<void>): Promise<void> {
    const next = this.queue.then(step, step);
    this.queue = next.catch(() => undefined);
    return next;
  }

  private setState(next: ConnectionState, problem = ""): void {
    if (next === this.state) {
      return;
    }
    if (!TRANSITIONS[this.state].includes(next)) {
      throw new Error(`keel connection cannot go from ${this.state} to ${next}`);
    }
    this.log.info(`connection ${this.state} -> ${next}${problem ? `: ${problem}` : ""}`);
    this.state = next;
    this.problem = problem;
    void vscode.commands.executeCommand("setContext", "keel.serverState", next);
    this.stateEmitter.fire(next);
  }

  private async doStart(): Promise<void> {
    this.setState(ConnectionState.Starting);
    const folder = vscode.workspace.workspaceFolders?.[0];
    const interpreter = await resolveInterpreter(folder, this.log, this.home);
    this.interpreter = interpreter;
    this.log.info(`python: ${interpreter.command} (from ${interpreter.source})`);
    const check = await checkKeelInstalled(interpreter.command, folder?.uri.fsPath);
    if (!check.ok) {
      this.setState(ConnectionState.NotInstalled, check.reason);
      void this.offerInstall(interpreter, check.reason);
      return;
    }
    const options = serverOptions(interpreter, folder);
    this.serverCommand = [options.command, ...(options.args ?? [])];
    this.log.info(`starting ${this.serverCommand.join(" ")}`);
    const client = new KeelLanguageClient("keel", "keel", options, this.clientOptions());
    client.onNotification(Notifications.missionChanged, (summary: MissionSummary) => this.changeEmitter.fire(summary));
    client.onNotification(Notifications.providersChanged, (p: ProvidersPayload) => this.providersEmitter.fire(p));
    client.onNotification(Notifications.activityChanged, (a: ActivityChanged) => this.activityEmitter.fire(a));
    client.registerFeature(noWindowProgress);
    client.onNotification(ShowMessageNotification.type, (p) => {
      if (FREE_TEXT_QUESTION.test(p.message)) {
        this.log.info(p.message);
        return;
      }
      const show = p.type === MessageType.Error ? vscode.window.showErrorMessage
        : p.type === MessageType.Warning ? vscode.window.showWarningMessage : vscode.window.showInformationMessage;
      void show(p.message);
    });
    try {
      await client.start();
    } catch (err) {
      this.setState(ConnectionState.Failed, String(err));
      void vscode.window.showErrorMessage(`keel: the language server did not start: ${String(err)}`, "Show Log")
        .then((pick) => pick && this.log.show());
      return;
    }
    this.client = client;
    this.setState(ConnectionState.Running);
    client.onDidChangeState((e) => {
      if (client === this.client && e.newState === State.Running) {
        this.log.info("the keel server was started again after it exited; reloading the missions");
        this.stateEmitter.fire(ConnectionState.Running);
      }
    });
  }

  /**
   * A server that exits is started again, up to MAX_RESTARTS times in RESTART_WINDOW_MS; after that the
   * connection is failed (the status bar says so) until a restart by command or a settings change.
   */
  private errorHandler(): ErrorHandler {
    const exits: number[] = [];
    return {
      error: () => ({ action: ErrorAction.Continue }),
      closed: () => {
        const now = Date.now();
        exits.push(now);
        while (exits.length > 0 && (exits[0] ?? now) < now - RESTART_WINDOW_MS) {
          exits.shift();
        }
        if (exits.length <= MAX_RESTARTS) {
          this.log.warn(`the keel server exited; starting it again (${exits.length}/${MAX_RESTARTS})`);
          return { action: CloseAction.Restart, handled: true };
        }
        const message = `the keel server exited ${exits.length} times in ${RESTART_WINDOW_MS / 60_000} minutes`;
        this.setState(ConnectionState.Failed, message);
        return { action: CloseAction.DoNotRestart, message: `keel: ${message}; see the keel log` };
      },
    };
  }

  private async doStop(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    if (client !== undefined) {
      try {
        await client.stop(5_000);
      } catch (err) {
        this.log.warn(`stopping the server: ${String(err)}`);
      }
      await client.dispose();
    }
    if (this.state !== ConnectionState.Stopped) {
      this.setState(ConnectionState.Stopped);
    }
  }

  private clientOptions(): LanguageClientOptions {
    return {
      documentSelector: [],
      outputChannel: this.log,
      traceOutputChannel: this.log,
      errorHandler: this.errorHandler(),
      stdioOptions: { stdout: (input) => pipeLines(input, (line) => this.log.info(line)), stderr: (input) => this.pipeServerLog(input) },
    };
  }

  /**
   * The server logs `<date> <time> LEVEL logger: message` lines to stderr (docs/lsp.md); each goes to the
   * channel at its own level, without the timestamp the channel adds anyway. Lines without a level
   * (traceback lines) keep the level of the line before them.
   */
  private pipeServerLog(input: NodeJS.ReadableStream): void {
    let level: "debug" | "info" | "warn" | "error" = "error";
    pipeLines(input, (line) => {
      const match = /^\d{4}-\d\d-\d\d [\d:,.]+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) (.*)$/.exec(line);
      if (match !== null) {
        level = LEVELS[match[1] ?? "ERROR"] ?? "error";
      }
      this.log[level](match?.[2] ?? line);
    });
  }

  /**
   * keel cannot start for this interpreter: one toast whose buttons act — use a workspace virtual
   * environment (or the Python extension's interpreter) that has keel, install keel, or choose another
   * interpreter. The Missions view's welcome offers the same while keel is not installed.
   */
  private async offerInstall(interpreter: Interpreter, reason: string): Promise<void> {
    const command = installCommand(interpreter.command, this.home);
    this.log.error(`keel is not installed for ${interpreter.command} (${interpreter.source}): ${reason}. ` +
      `Install it with: ${command}`);
    const folder = vscode.workspace.workspaceFolders?.[0];
    const others = (await candidateInterpreters(folder, this.log)).filter((c) => c.python !== interpreter.command);
    const checked = await Promise.all(others.map(async (c) => ({ ...c,
      ok: (await checkKeelInstalled(c.python, folder?.uri.fsPath)).ok })));
    const ready = checked.filter((c) => c.ok);
    const uses = ready.map((c) => `Use ${c.label}`);
    const found = ready.length > 0 ? ` ${ready.map((c) => c.label).join(" and ")} ${ready.length > 1 ? "have" : "has"} keel.` : "";
    const pick = await vscode.window.showWarningMessage(
      `keel is not installed for ${interpreter.command} (${interpreter.source}).${found} Install keel makes keel's ` +
      "own environment from the copy this extension carries (Python 3.11+ needed; its dependencies come from PyPI).",
      ...uses, "Install keel", "Choose Interpreter…");
    const use = ready.find((c) => pick === `Use ${c.label}`);
    if (use !== undefined) {
      await vscode.commands.executeCommand("keel.useInterpreter", use.python);
    } else if (pick === "Install keel") {
      await vscode.commands.executeCommand("keel.installServer");
    } else if (pick === "Choose Interpreter…") {
      await vscode.commands.executeCommand("keel.chooseInterpreter");
    }
  }
}

const LEVELS: Record<string, "debug" | "info" | "warn" | "error"> = {
  DEBUG: "debug", INFO: "info", WARNING: "warn", ERROR: "error", CRITICAL: "error",
};

function pipeLines(input: NodeJS.ReadableStream, sink: (line: string) => void): void {
  readline.createInterface({ input, crlfDelay: Infinity, terminal: false }).on("line", sink);
}

function serverOptions(interpreter: Interpreter, folder: vscode.WorkspaceFolder | undefined): Executable {
  const config = vscode.workspace.getConfiguration("keel");
  const store = config.get<string>("store", "").trim();
  const verbose = config.get<string>("logLevel", "info") === "debug";
  const args = ["-m", "keel.server.cli", "serve", ...(store ? ["--store", resolveStore(store, folder)] : []),
    ...(verbose ? ["--verbose"] : [])];
  return { command: interpreter.command, args, options: { cwd: folder?.uri.fsPath } };
}

/** `keel.store` may be relative to the workspace folder or use ${workspaceFolder}. */
function resolveStore(store: string, folder: vscode.WorkspaceFolder | undefined): string {
  const expanded = store.replace(/\$\{workspaceFolder\}/g, folder?.uri.fsPath ?? "");
  return folder === undefined || path.isAbsolute(expanded) ? expanded : path.join(folder.uri.fsPath, expanded);
}
