// The web chat page at `/`, in a real browser: Debian's Chromium, headless, driven by
// Playwright. Run by tests/serve/test_web.py against a `lone serve` with two models
// (LONE_URL, LONE_CHAT_MODEL: the one to talk to). Exits non-zero on the first failed check.
import { launch, openPage, step } from "./browser.mjs";
import assert from "node:assert/strict";

const base = process.env.LONE_URL;
const model = process.env.LONE_CHAT_MODEL;
const shot = process.env.LONE_SCREENSHOT;
assert.ok(base && model, "set LONE_URL and LONE_CHAT_MODEL");

const browser = await launch();
try {
  const { page, errors, bodies } = await openPage(browser);
  // Nothing but the server itself: the page works offline.
  const hosts = new Set();
  page.on("request", (r) => hosts.add(new URL(r.url()).host));

  await page.goto(base);
  await page.waitForSelector('body[data-models="2"]');
  step("the model picker lists both models");
  assert.equal(await page.locator("#model").isVisible(), true);
  const options = await page.locator("#model option").evaluateAll((os) => os.map((o) => o.value));
  assert.equal(options.length, 2);
  assert.ok(options.includes(model), options.join(","));
  await page.selectOption("#model", model);

  step("markdown: code blocks, inline code, emphasis, lists, links; HTML escaped");
  const md = await page.evaluate(() => window.loneMarkdown(
    "# Title\nSome **bold** and *it* with `x<y`.\n\n```python\nprint('<b>')\n```\n- one\n- two\n\n[ok](https://example.org) [bad](javascript:alert(1))\n<script>alert(1)</script>"));
  assert.match(md, /<h1>Title<\/h1>/);
  assert.match(md, /<strong>bold<\/strong>/);
  assert.match(md, /<em>it<\/em>/);
  assert.match(md, /<code>x&lt;y<\/code>/);
  assert.match(md, /<pre><code class="language-python">print\(&#39;&lt;b&gt;&#39;\)<\/code><\/pre>/);
  assert.match(md, /<ul><li>one<\/li><li>two<\/li><\/ul>/);
  assert.match(md, /<a href="https:\/\/example.org" target="_blank" rel="noopener noreferrer">ok<\/a>/);
  assert.doesNotMatch(md, /href="javascript/);
  assert.doesNotMatch(md, /<script>/);

  step("settings go into the request; the reply streams in");
  await page.fill("#system", "You are a helpful assistant.");
  await page.fill("#temperature", "0");
  await page.fill("#top-p", "1");
  await page.fill("#max-tokens", "48");
  await page.evaluate(() => {
    window.updates = 0;
    new MutationObserver(() => window.updates++).observe(document.getElementById("messages"),
      { childList: true, subtree: true, characterData: true });
  });
  await page.fill("#input", "What is the capital of France?");
  await page.press("#input", "Enter");
  const first = page.locator(".msg.assistant").nth(0);
  await page.waitForSelector('.msg.assistant[data-state="done"]', { timeout: 60000 });
  const reply = await first.locator(".content").innerText();
  assert.match(reply, /Paris/, reply);
  assert.ok(await page.evaluate(() => window.updates) >= 4, "the reply did not stream");
  const stats = await first.locator(".stats").innerText();
  assert.match(stats, /\d+ prompt tokens · \d+ generated · [\d.]+ tok\/s · first token [\d.]+ s/, stats);
  const b0 = bodies[0];
  assert.equal(b0.model, model);
  assert.equal(b0.stream, true);
  assert.equal(b0.temperature, 0);
  assert.equal(b0.top_p, 1);
  assert.equal(b0.max_tokens, 48);
  assert.deepEqual(b0.messages, [
    { role: "system", content: "You are a helpful assistant." },
    { role: "user", content: "What is the capital of France?" },
  ]);

  step("stop ends a long reply: the text stops growing, Send is back");
  await page.fill("#temperature", "0.8");
  await page.fill("#max-tokens", "1500");
  await page.fill("#input", "Write a very long story about a dragon and a knight.");
  await page.click("#send");
  const second = page.locator(".msg.assistant").nth(1);
  await page.waitForFunction(() => {
    const m = document.querySelectorAll(".msg.assistant")[1];
    return m && m.innerText.length > 40;
  }, null, { timeout: 60000 });
  assert.equal(await page.locator("#stop").isVisible(), true);
  assert.equal(await page.locator("#send").isVisible(), false);
  await page.click("#stop");
  await page.waitForSelector('.msg.assistant[data-state="stopped"]', { timeout: 10000 });
  const len = (await second.locator(".content").innerText()).length;
  await page.waitForTimeout(1500);
  assert.equal((await second.locator(".content").innerText()).length, len);
  assert.match(await second.locator(".stats").innerText(), /stopped/);
  assert.equal(await page.locator("#send").isVisible(), true);
  assert.equal(await page.locator("#stop").isVisible(), false);
  // The second request carried the conversation so far.
  const roles = bodies[1].messages.map((m) => m.role);
  assert.deepEqual(roles, ["system", "user", "assistant", "user"]);
  assert.equal(bodies[1].messages[2].content, reply);

  if (shot) await page.screenshot({ path: shot, fullPage: true });
  assert.deepEqual([...hosts], [new URL(base).host], "the page fetched from another host");
  assert.deepEqual(errors, []);
  step("ok");
} finally {
  await browser.close();
}
