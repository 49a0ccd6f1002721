// Runs the mission page's pure functions (client-vscode/src/page/groups.ts, picture.ts, protocol.ts) on the
// cases tests/vscode/test_page_tables.py gives, with no browser: esbuild bundles them for Node, this prints
// one JSON answer per case.
//
//   node page_tables.mjs '[{"fn": "groupUnits", "args": [...]}, ...]'
import * as esbuild from "esbuild";

const cases = JSON.parse(process.argv[2]);
const built = await esbuild.build({
  stdin: {
    contents: `export * from "./client-vscode/src/page/groups.ts";
export * from "./client-vscode/src/page/picture.ts";
export { tabTitle } from "./client-vscode/src/protocol.ts";`,
    resolveDir: process.cwd(), loader: "ts",
  },
  bundle: true, format: "esm", platform: "node", write: false, logLevel: "error",
});
const url = `data:text/javascript;base64,${Buffer.from(built.outputFiles[0].text).toString("base64")}`;
const page = await import(url);

const answers = cases.map(({ fn, args }) => {
  switch (fn) {
    case "levels":
      return Object.fromEntries(page.levels(...args));
    case "groupUnits": {
      const [units, by, asking] = args;
      return page.groupUnits(units, by, asking, page.levels(units)).map((g) => ({
        key: g.key, label: g.label, units: g.units.map((u) => u.id), counts: g.counts,
        folded: page.startsFolded(g, units.length),
      }));
    }
    case "binMarks":
      return page.binMarks(...args).map((b) => ({ key: b.key, lane: b.lane, count: b.marks.length, failed: b.failed }));
    default:
      return page[fn](...args);
  }
});
process.stdout.write(JSON.stringify(answers) + "\n");
