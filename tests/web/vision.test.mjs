// The web chat page's image attachments, in a real browser (Debian's Chromium, Playwright):
// run by tests/serve/test_web.py against a `lone serve` of a vision-language model and a
// text-only one (LONE_URL; LONE_VL_MODEL, LONE_TEXT_MODEL: their ids; LONE_IMAGE: a PNG;
// LONE_PROMPT_TOKENS: the prompt's length with that image, from transformers). Exits
// non-zero on the first failed check.
import { launch, openPage, step } from "./browser.mjs";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

const base = process.env.LONE_URL;
const vl = process.env.LONE_VL_MODEL;
const textModel = process.env.LONE_TEXT_MODEL;
const imagePath = process.env.LONE_IMAGE;
const promptTokens = process.env.LONE_PROMPT_TOKENS;
assert.ok(base && vl && textModel && imagePath && promptTokens, "set LONE_URL, LONE_VL_MODEL, LONE_TEXT_MODEL, LONE_IMAGE, LONE_PROMPT_TOKENS");

const browser = await launch();
try {
  const { page, errors, bodies } = await openPage(browser);
  await page.goto(base);
  await page.waitForSelector('body[data-models="2"]');

  step("the attach button shows for the vision model only");
  await page.selectOption("#model", textModel);
  assert.equal(await page.locator("#attach").isVisible(), false);
  await page.selectOption("#model", vl);
  assert.equal(await page.locator("#attach").isVisible(), true);

  step("an attached image shows, can be removed, and goes with the next message");
  await page.setInputFiles("#file", [imagePath, imagePath]);
  await page.waitForSelector('body[data-attached="2"]');
  await page.locator("#attachments img").nth(1).click();
  await page.waitForSelector('body[data-attached="1"]');
  await page.fill("#system", "");
  await page.fill("#temperature", "0");
  await page.fill("#max-tokens", "12");
  await page.fill("#input", "What is this?");
  await page.press("#input", "Enter");
  await page.waitForSelector('.msg.assistant[data-state="done"]', { timeout: 60000 });
  assert.equal(await page.locator('body[data-attached="0"]').count(), 1);
  assert.equal(await page.locator(".msg.user img").count(), 1);
  const stats = await page.locator(".msg.assistant .stats").first().innerText();
  assert.match(stats, new RegExp("^" + promptTokens + " prompt tokens"), stats);
  const want = "data:image/png;base64," + readFileSync(imagePath).toString("base64");
  assert.deepEqual(bodies[0].messages, [{ role: "user", content: [
    { type: "image_url", image_url: { url: want } },
    { type: "text", text: "What is this?" },
  ] }]);

  step("a follow-up keeps the image in the conversation; switching to a text model drops attachments");
  await page.fill("#input", "And now?");
  await page.press("#input", "Enter");
  await page.waitForFunction(() => document.querySelectorAll('.msg.assistant[data-state="done"]').length === 2,
    null, { timeout: 60000 });
  assert.equal(bodies[1].messages[0].content[0].image_url.url, want);
  await page.setInputFiles("#file", imagePath);
  await page.waitForSelector('body[data-attached="1"]');
  await page.selectOption("#model", textModel);
  await page.waitForSelector('body[data-attached="0"]');
  assert.deepEqual(errors, []);
  step("ok");
} finally {
  await browser.close();
}
