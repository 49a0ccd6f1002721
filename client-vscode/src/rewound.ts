/**
 * Saying what a rewind or a fork just did: a restore says "rewound to pN" with a Resume button and closes
 * the diff tabs of that mission's points (their sandbox side is no longer what they show); a fork says
 * what it is called, that it waits paused, and offers Resume and Open Mission. Must not draw views.
 */
import * as vscode from "vscode";
import { missionLabel, type MissionSummary } from "./protocol";

/** The scheme of a restore point's (or the sandbox's) files: `keel-point:/<mission>/<point>/<path>`. */
export const POINT_SCHEME = "keel-point";

/** Close the open diffs of a mission's points and sandbox; returns how many were closed. */
export async function closePointDiffs(missionId: string): Promise<number> {
  const ours = (uri: vscode.Uri): boolean => uri.scheme === POINT_SCHEME && uri.path.startsWith(`/${missionId}/`);
  const stale = vscode.window.tabGroups.all.flatMap((g) => g.tabs).filter((tab) => {
    const input = tab.input;
    return (input instanceof vscode.TabInputTextDiff && (ours(input.original) || ours(input.modified)))
      || (input instanceof vscode.TabInputText && ours(input.uri));
  });
  if (stale.length > 0) {
    await vscode.window.tabGroups.close(stale);
  }
  return stale.length;
}

/** After a restore: stale diffs closed, then one toast naming the point, with Resume. */
export async function sayRewound(summary: MissionSummary, point: string, files: boolean): Promise<void> {
  const closed = await closePointDiffs(summary.id);
  const what = files ? "progress and files" : "progress only";
  const tabs = closed > 0 ? `; ${closed} diff tab${closed > 1 ? "s" : ""} of its old files closed` : "";
  const pick = await vscode.window.showInformationMessage(
    `keel: ${missionLabel(summary)} rewound to ${point} (${what}), paused${tabs}`, "Resume");
  if (pick === "Resume") {
    await vscode.commands.executeCommand("keel.resume", summary.id);
  }
}

/** After a fork: where it went (its name, paused, selected in Missions), with Resume and Open Mission. */
export async function sayForked(original: string, point: string, fork: MissionSummary): Promise<void> {
  const pick = await vscode.window.showInformationMessage(
    `keel: forked ${original} at ${point} as "${missionLabel(fork)}": a new mission in the Missions view, ` +
    "paused until you resume it", "Resume", "Open Mission");
  if (pick === "Resume") {
    await vscode.commands.executeCommand("keel.resume", fork.id);
  } else if (pick === "Open Mission") {
    await vscode.commands.executeCommand("keel.openMission", fork.id);
  }
}
