// Build the live view into OUTDIR (default ../dist/web): index.html, app.js
// (one bundle: React, MUI, Perses and its plugins, from node_modules as the
// committed package-lock.json pins them), and dashboards/ (the Perses
// dashboards generate.py wrote, with index.json, the list the page shows).
// No network, no CDN: everything the page loads comes from OUTDIR.
import { build } from 'esbuild';
import { copyFileSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const out = resolve(process.argv[2] || join(here, '..', 'dist', 'web'));
const dashboards = join(here, '..', 'dashboards', 'perses');
// The order of the tabs: the campaign's overview first.
const ORDER = ['transfer-overview', 'campaign', 'router-traffic', 'links', 'disk-io', 'cpu'];

// Emptied, not removed: a running container (the compose stack) mounts this very
// directory, and would keep serving a removed one's emptiness.
mkdirSync(out, { recursive: true });
for (const entry of readdirSync(out)) rmSync(join(out, entry), { recursive: true, force: true });
mkdirSync(join(out, 'dashboards'), { recursive: true });

// Two modules of ours in the place of others: our EChart (src/echart.jsx) for
// Perses's, which redraws a chart whole after every render of its panel, and
// src/gcd.js for mathjs (see those files); and one line of Perses's changed as
// it is bundled (below): what its refresh timer calls. Not found, the build
// fails (a new Perses moved it).
let timerChanged = false;
const ourModules = {
  name: 'longhaul-modules',
  setup(bundle) {
    // mathjs: src/gcd.js, the one function of it Perses uses.
    bundle.onResolve({ filter: /^mathjs$/ }, () => ({ path: join(here, 'src', 'gcd.js') }));
    bundle.onResolve({ filter: /^\.\/EChart$/ }, (args) =>
      /@perses-dev[\\/]components[\\/]dist[\\/]EChart$/.test(args.resolveDir) ? { path: join(here, 'src', 'echart.jsx') } : undefined
    );
    // A refresh waits while the last one's queries are in flight (src/refresh.js).
    bundle.onLoad({ filter: /@perses-dev[\\/]plugin-system[\\/]dist[\\/]runtime[\\/]TimeRangeProvider[\\/]TimeRangeProvider\.js$/ }, (args) => {
      const source = readFileSync(args.path, 'utf8');
      const timer = /setInterval\(\(\)=>\{\s*refresh\(\);\s*\}, refreshIntervalInMs\)/g;
      const found = (source.match(timer) || []).length;
      if (found !== 1) {
        throw new Error(`${args.path}: expected Perses's refresh timer (setInterval calling refresh()) once, found it ${found} times: see web/build.mjs`);
      }
      const ours = JSON.stringify(join(here, 'src', 'refresh.js'));
      timerChanged = true;
      return {
        contents: `import { refreshUnlessBusy } from ${ours};\n` + source.replace(timer, 'setInterval(()=>refreshUnlessBusy(refresh, refreshIntervalInMs), refreshIntervalInMs)'),
        loader: 'jsx',
      };
    });
  },
};

await build({
  plugins: [ourModules],
  entryPoints: [join(here, 'src', 'main.jsx')],
  bundle: true,
  minify: true,
  sourcemap: false,
  platform: 'browser',
  // ESM builds only: a package bundled both as ESM and CommonJS would have two
  // React contexts (react-query's, Perses's), and its providers would not be seen.
  mainFields: ['browser', 'module', 'main'],
  format: 'iife',
  target: ['chrome110'],
  jsx: 'automatic',
  loader: { '.js': 'jsx', '.woff': 'file', '.woff2': 'file', '.svg': 'file', '.png': 'file' },
  define: { 'process.env.NODE_ENV': '"production"', global: 'globalThis' },
  outfile: join(out, 'app.js'),
  logLevel: 'warning',
  legalComments: 'external',
});

if (!timerChanged) throw new Error("Perses's refresh timer was not found to change: see web/build.mjs");

copyFileSync(join(here, 'index.html'), join(out, 'index.html'));
const index = [];
for (const file of readdirSync(dashboards).filter((f) => f.endsWith('.json'))) {
  const board = JSON.parse(readFileSync(join(dashboards, file), 'utf8'));
  const name = file.replace(/\.json$/, '');
  writeFileSync(join(out, 'dashboards', file), JSON.stringify(board));
  index.push({ name, title: board.spec.display.name.replace(/^longhaul \/ /, ''), uid: board.metadata.name });
}
index.sort((a, b) => (ORDER.indexOf(a.name) + 1 || 99) - (ORDER.indexOf(b.name) + 1 || 99));
writeFileSync(join(out, 'dashboards', 'index.json'), JSON.stringify(index));
console.log(`live view: ${out} (${index.length} dashboards)`);
