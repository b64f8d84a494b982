// Loads an exitscope HTML report in headless Chromium (Debian's /usr/bin/chromium, driven by
// playwright-core) and prints one JSON object saying what the page did:
//
//   node web/check_page.cjs --modules BUILD/web/node_modules --page report.html \
//        --screenshot report.png [--chromium /usr/bin/chromium] [--timeout-ms 20000]
//
//   {"console_errors": [...], "page_errors": [...], "requests": [...], "charts": N,
//    "drawn": [{"id", "kind", "drawn", "canvas_painted", "width", "height"}], "title",
//    "tables": N, "load_ms": T}
//
// "requests" lists every request other than the page's own file: a self-contained page makes
// none. A chart counts as drawn when ECharts reported it finished (data-drawn="1", set by the
// page) and its canvas holds painted pixels. Exit status 0 when the page loaded, 1 when it
// could not be loaded or checked (the reason on stderr); the caller judges the JSON.
'use strict';
const path = require('path');

function arg(name, dflt) {
  const i = process.argv.indexOf(name);
  return i > 0 && i + 1 < process.argv.length ? process.argv[i + 1] : dflt;
}

async function main() {
  const modules = path.resolve(arg('--modules'));
  const page_file = path.resolve(arg('--page'));
  const shot = arg('--screenshot');
  const chromium_path = arg('--chromium', '/usr/bin/chromium');
  const timeout = Number(arg('--timeout-ms', '20000'));
  const { chromium } = require(path.join(modules, 'playwright-core'));
  const browser = await chromium.launch({
    executablePath: chromium_path,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking',
           '--disable-component-update', '--no-first-run', '--disable-sync'],
  });
  const result = { console_errors: [], page_errors: [], requests: [], drawn: [] };
  try {
    const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
    const page = await context.newPage();
    const url = 'file://' + page_file;
    page.on('console', (m) => {
      if (m.type() === 'error') result.console_errors.push(m.text());
    });
    page.on('pageerror', (e) => result.page_errors.push(String(e)));
    page.on('request', (r) => {
      if (r.url() !== url) result.requests.push(r.url());
    });
    const t0 = Date.now();
    await page.goto(url, { waitUntil: 'load', timeout });
    // Every chart element reports drawn, or the timeout.
    await page
      .waitForFunction(
        () => {
          const els = document.querySelectorAll('.chart');
          return els.length > 0 && Array.from(els).every((e) => e.dataset.drawn === '1');
        },
        null,
        { timeout },
      )
      .catch(() => {});
    result.load_ms = Date.now() - t0;
    Object.assign(
      result,
      await page.evaluate(() => {
        const charts = Array.from(document.querySelectorAll('.chart')).map((el) => {
          const canvases = Array.from(el.querySelectorAll('canvas'));
          let painted = false, width = 0, height = 0;
          for (const c of canvases) {
            width = Math.max(width, c.width);
            height = Math.max(height, c.height);
            const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            for (let i = 3; i < px.length; i += 4) {
              if (px[i] !== 0) { painted = true; break; }
            }
          }
          return { id: el.id, kind: el.dataset.kind, drawn: el.dataset.drawn === '1',
                   canvas_painted: painted, width, height };
        });
        return { title: document.title, charts: Number(document.body.dataset.charts || 0),
                 drawn: charts, tables: document.querySelectorAll('table').length };
      }),
    );
    if (shot) await page.screenshot({ path: shot, fullPage: true });
  } finally {
    await browser.close();
  }
  process.stdout.write(JSON.stringify(result) + '\n');
}

main().catch((e) => {
  process.stderr.write('check_page: ' + (e && e.message ? e.message.split('\n')[0] : e) + '\n');
  process.exit(1);
});
