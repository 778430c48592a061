// Drives headless Chromium (Debian's, through playwright-core) through the
// master's accounts page and checks what an operator would: the suppressed
// account is in the table and marked, the filters and the sort work, and
// its suppression is in the live events list.
//
//   node accounts_page.mjs URL SUPPRESSED CALM
//
// URL is the master's HTTP endpoint; SUPPRESSED an account being suppressed
// on `messages`; CALM one under its limit. Exits 0 when every check holds,
// 1 with the reason otherwise. Prints the table as text (what the page
// shows) on success.
import { chromium } from "playwright-core";

const [url, suppressed, calm] = process.argv.slice(2);
if (!url || !suppressed || !calm) {
  console.error("usage: node accounts_page.mjs URL SUPPRESSED CALM");
  process.exit(2);
}

const row = (account, op = "messages") => `#accounts tbody tr[data-account="${account}"][data-op="${op}"]`;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  // The machine's network is closed: keep Chromium from calling home.
  args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
});
let failed = false;
try {
  const page = await browser.newPage();
  page.setDefaultTimeout(20_000);
  page.on("pageerror", (e) => { console.error(`page error: ${e.message}`); failed = true; });
  await page.goto(url);

  // 1. The suppressed account is in the table, marked, with a factor.
  const flood = page.locator(row(suppressed));
  await flood.and(page.locator(".suppressed")).waitFor();
  const factor = Number(await flood.getAttribute("data-factor"));
  if (!(factor > 0 && factor < 1)) throw new Error(`${suppressed}: factor ${factor}`);
  const shown = await flood.locator("td.factor").innerText();
  if (!/^\d+(\.\d)?%$/.test(shown)) throw new Error(`${suppressed}: factor shown as ${shown}`);
  // The calm account is listed too, not marked.
  const quiet = page.locator(row(calm));
  await quiet.waitFor();
  if ((await quiet.getAttribute("class")) === "suppressed") throw new Error(`${calm} marked suppressed`);

  // 2. "Which accounts are being suppressed on messages right now?"
  await page.fill("#op", "messages");
  await page.fill("#min-factor", "0.1");
  await quiet.waitFor({ state: "detached" });
  await flood.waitFor();
  for (const tr of await page.locator("#accounts tbody tr").all()) {
    const [op, f] = [await tr.getAttribute("data-op"), Number(await tr.getAttribute("data-factor"))];
    if (op !== "messages" || f < 0.1) throw new Error(`filtered table shows ${op} at ${f}`);
  }
  if (!new URL(page.url()).hash.includes("min_factor=0.1")) throw new Error(`filters not in the URL: ${page.url()}`);

  // 3. Another op: the account's messages row goes.
  await page.fill("#min-factor", "0");
  await page.fill("#op", "presence");
  await flood.waitFor({ state: "detached" });
  await page.locator(row(suppressed, "presence")).waitFor();
  await page.fill("#op", "");

  // 4. Sort by account, ascending, then by demand, largest first.
  await page.click('th[data-sort="account"]');
  await page.waitForFunction(() => {
    const names = [...document.querySelectorAll("#accounts tbody tr")].map((r) => r.dataset.account);
    return names.length > 2 && names.every((n, i) => i === 0 || names[i - 1] <= n);
  });
  await page.click('th[data-sort="demand"]');
  if ((await page.getAttribute('th[data-sort="demand"]', "aria-sort")) !== "descending") {
    throw new Error("demand header not marked as the sort");
  }
  await page.locator("#accounts tbody tr").first().and(page.locator(row(suppressed))).waitFor();

  // 5. The events: the flood's suppression started (before the page
  // loaded: the page asks for every kept event), marked by kind.
  const started = page.locator(`#events li[data-kind="suppression_started"][data-account="${suppressed}"][data-op="messages"]`);
  await started.waitFor();
  if (!(await started.innerText()).includes("suppression started")) throw new Error("event not described");
  if ((await page.locator(`#events li[data-account="${calm}"][data-kind="suppression_started"]`).count()) !== 0) {
    throw new Error(`${calm} shown as suppressed in the events`);
  }

  // What the page shows, as text.
  const header = await page.locator("#accounts thead th").allInnerTexts();
  console.log(header.join(" | "));
  for (const tr of await page.locator("#accounts tbody tr").all()) {
    console.log((await tr.locator("td").allInnerTexts()).join(" | "));
  }
  console.log(await page.locator("#status").innerText());
  for (const li of await page.locator("#events li").all()) console.log(await li.innerText());
} catch (e) {
  console.error(`accounts page: ${e.message}`);
  failed = true;
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
