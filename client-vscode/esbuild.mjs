// Bundles the extension (and its extension-host test suite) into client-vscode/out/ as CommonJS for the
// VS Code extension host. `vscode` is provided by the host; everything else is bundled, so the VSIX
// carries no node_modules. Type checking is `tsc --noEmit` (npm run typecheck); esbuild only strips types.
import * as esbuild from "esbuild";

const production = process.argv.includes("--production");
const common = {
  bundle: true,
  platform: "node",
  format: "cjs",
  target: "node20",
  external: ["vscode"],
  sourcemap: production ? false : "linked",
  minify: production,
  logLevel: "warning",
};

await esbuild.build({ ...common, entryPoints: ["client-vscode/src/extension.ts"], outfile: "client-vscode/out/extension.js" });
await esbuild.build({ ...common, entryPoints: ["client-vscode/test/suite.ts"], outfile: "client-vscode/out/test/suite.js" });
// the mission page's script runs in a webview (a browser): one self-contained file, loaded with a nonce
await esbuild.build({ ...common, platform: "browser", format: "iife", target: "es2022", external: [],
  entryPoints: ["client-vscode/src/page/main.ts"], outfile: "client-vscode/out/page.js" });
