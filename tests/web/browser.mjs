// What the browser tests share: Debian's Chromium, headless, and a page that records its
// errors and the bodies of its chat requests.
import { chromium } from "playwright-core";

export async function launch() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
}

export const step = (s) => console.log("- " + s);

/// A new page of `browser`, with `errors` (uncaught page errors) and `bodies` (the JSON
/// bodies of its /v1/chat/completions requests) filled as it runs.
export async function openPage(browser) {
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  const bodies = [];
  page.on("request", (r) => {
    if (r.url().endsWith("/v1/chat/completions")) bodies.push(JSON.parse(r.postData()));
  });
  return { page, errors, bodies };
}
