// Plots of the web view: the server builds each Vega-Lite spec (data inline); this embeds it with Vega's
// expression interpreter, so no code is generated at run time (the page's policy forbids eval).
"use strict";

async function plot(element) {
  const response = await fetch(element.dataset.spec, { credentials: "same-origin" });
  const spec = await response.json();
  if (!response.ok) { element.textContent = spec.error || "the plot could not be made"; element.classList.add("error"); return; }
  await vegaEmbed(element, spec, {
    renderer: "svg",
    ast: true,
    expr: vegaInterpreter.expressionInterpreter,
    defaultStyle: false,
    tooltip: { disableDefaultStyle: true }, // their styles are in simrun.css: the policy refuses inline ones
    actions: { export: true, source: false, compiled: false, editor: false },
  });
  element.dataset.kind = (spec.usermeta || {}).kind || "";
  element.dataset.ready = "true";
}

document.addEventListener("DOMContentLoaded", () => {
  for (const element of document.querySelectorAll(".plot[data-spec]")) {
    if (element.dataset.spec) plot(element);
  }
});
