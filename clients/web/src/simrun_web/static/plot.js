// Plots of the web view: the server builds the Vega-Lite spec (data inline); this embeds it with Vega's
// expression interpreter, so no code is generated at run time (the page's policy forbids eval).
"use strict";

document.addEventListener("DOMContentLoaded", async () => {
  const element = document.getElementById("plot");
  if (!element || !element.dataset.spec) return;
  const response = await fetch(element.dataset.spec, { credentials: "same-origin" });
  const spec = await response.json();
  if (!response.ok) { element.textContent = spec.error || "the plot could not be made"; element.classList.add("error"); return; }
  const result = await vegaEmbed(element, spec, {
    renderer: "svg",
    ast: true,
    expr: vegaInterpreter.expressionInterpreter,
    defaultStyle: false,
    tooltip: { disableDefaultStyle: true }, // their styles are in simrun.css: the policy refuses inline ones
    actions: { export: true, source: false, compiled: false, editor: false },
  });
  element.dataset.kind = (spec.usermeta || {}).kind || "";
  element.dataset.ready = "true";
  window.simrunView = result.view;
});
