// simrun's web view: live parts of its pages, fed by server-sent events. Everything a run says is set as text.
"use strict";

function setText(root, selector, text) {
  const element = root.querySelector(selector);
  if (element) element.textContent = text;
}

function setState(element, state) {
  if (!element) return;
  for (const name of [...element.classList]) if (name.startsWith("state-")) element.classList.remove(name);
  element.classList.add("state-" + state);
  element.textContent = state;
}

function seconds(value) {
  if (value === null || value === undefined) return "";
  if (value < 90) return Math.round(value) + " s";
  if (value < 5400) return Math.round(value / 60) + " min";
  return (value / 3600).toFixed(1) + " h";
}

function follow(url, handlers) {
  if (!url) return;
  const source = new EventSource(url);
  for (const [name, handler] of Object.entries(handlers)) {
    source.addEventListener(name, (event) => handler(JSON.parse(event.data)));
  }
  source.addEventListener("end", () => { source.close(); if (handlers.closed) handlers.closed(); });
  source.onerror = () => { if (source.readyState === EventSource.CLOSED && handlers.refused) handlers.refused(); };
  window.addEventListener("pagehide", () => source.close());
  return source;
}

function updateTask(row, task) {
  setState(row.querySelector('[data-field="state"]'), task.state);
  const progress = row.querySelector("progress");
  if (progress && task.units !== null) { progress.max = task.units; progress.value = task.units_done; }
  setText(row, '[data-field="units"] .count', task.units === null ? "" : task.units_done + "/" + task.units);
  setText(row, '[data-field="rate"]', task.rate ? task.rate.toFixed(2) + " units/s" : "");
  setText(row, '[data-field="left"]', seconds(task.left_s));
  setText(row, '[data-field="message"]', task.message);
  const pods = row.querySelector('[data-field="pods"]');
  if (pods) pods.textContent = pods.textContent.replace(/^\d+/, String(task.pods_started));
}

// The parts of a run's page the live stream does not carry: fetched again (the page itself, same origin) when a
// pod starts and when the run ends, one fetch at a time.
const REFRESHED = ["run-ended", "pods", "kills", "outputs"];

function refresher() {
  let busy = false, again = false;
  const refresh = () => {
    if (busy) { again = true; return; }
    busy = true;
    fetch(location.href, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then((response) => (response.ok ? response.text() : Promise.reject(new Error(String(response.status)))))
      .then((html) => {
        const fresh = new DOMParser().parseFromString(html, "text/html");
        for (const id of REFRESHED) {
          const shown = document.getElementById(id), now = fresh.getElementById(id);
          if (shown && now) shown.replaceWith(document.importNode(now, true));
        }
      })
      .catch(() => {})
      .finally(() => { busy = false; if (again) { again = false; refresh(); } });
  };
  return refresh;
}

function runPage(root) {
  const refresh = refresher();
  let pods = document.querySelectorAll("#pods tbody tr").length;  // the pods the page was served with
  follow(root.dataset.events, {
    run: (run) => {
      const started = run.tasks.reduce((sum, task) => sum + task.pods_started, 0);
      if (started !== pods || run.final) refresh();
      pods = started;
      setState(document.getElementById("run-state"), run.state);
      setText(document, "#run-message", run.message);
      for (const task of run.tasks) {
        const row = root.querySelector('#tasks tr[data-task="' + CSS.escape(task.task_id) + '"]');
        if (row) updateTask(row, task);
        const node = root.querySelector('.dag [data-task="' + CSS.escape(task.task_id) + '"]');
        if (node) {
          for (const c of [...node.classList]) if (c.startsWith("state-")) node.classList.remove(c);
          node.classList.add("state-" + task.state);
          setText(node, '[data-field="state"]', task.state);
          setText(node, "title", task.task_id + ": " + task.state);
        }
      }
      if (run.final) { const form = document.getElementById("cancel-form"); if (form) form.remove(); }
    },
  });
}

function cell(row, text, field, className) {
  const td = document.createElement("td");
  if (field) td.dataset.field = field;
  if (className) td.className = className;
  if (text !== null) td.textContent = text;
  row.append(td);
  return td;
}

// A row for a run submitted while the page is open, as the template draws one, at the top (newest first).
function newRunRow(table, run) {
  const body = table.tBodies[0];
  for (const none of body.querySelectorAll("tr.none")) none.remove();
  const row = document.createElement("tr");
  row.dataset.run = run.run_id;
  row.classList.add("new");
  const link = document.createElement("a");
  link.href = "/runs/" + encodeURIComponent(run.run_id);
  link.textContent = run.run_id;
  cell(row, null).append(link);
  cell(row, run.group);
  cell(row, run.submitted_by);
  cell(row, run.state, "state", "state state-" + run.state);
  const progress = cell(row, null, "progress");
  for (const name of ["done", "units"]) {
    const span = document.createElement("span");
    span.className = name;
    progress.append(span, " ");
  }
  cell(row, run.submitted);
  cell(row, run.message, "message", "message");
  body.prepend(row);
  return row;
}

function runsPage(table) {
  follow(table.dataset.events, {
    run: (run) => {
      let row = table.querySelector('tr[data-run="' + CSS.escape(run.run_id) + '"]');
      if (!row && run.new) row = newRunRow(table, run);
      if (!row) return;
      setState(row.querySelector('[data-field="state"]'), run.state);
      setText(row, '[data-field="message"]', run.message);
      setText(row, '[data-field="progress"] .done', run.tasks_done + "/" + run.tasks_total);
      const running = run.tasks.filter((task) => task.state === "running" && task.units !== null);
      setText(row, '[data-field="progress"] .units',
        running.map((task) => task.task_id + " " + task.units_done + "/" + task.units + " units").join(", "));
    },
  });
}

function logPage(pre) {
  const state = document.getElementById("log-state");
  let last = "";
  follow(pre.dataset.events, {
    lines: (chunk) => {
      const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      if (chunk.pod !== last) { pre.append(document.createTextNode("── " + chunk.pod + "\n")); last = chunk.pod; }
      pre.append(document.createTextNode(chunk.lines));
      if (atEnd) pre.scrollTop = pre.scrollHeight;
      state.textContent = "following";
    },
    error: (error) => { state.textContent = error.message; },
    closed: () => { state.textContent = "the task has ended: this is the whole log"; },
    refused: () => { state.textContent = "not following: reload to try again"; },
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const run = document.getElementById("run");
  if (run) runPage(run);
  const runs = document.getElementById("runs");
  if (runs) runsPage(runs);
  const log = document.getElementById("log");
  if (log) logPage(log);
  const cancel = document.getElementById("cancel-form");
  if (cancel) cancel.addEventListener("submit", (event) => {
    if (!window.confirm("Cancel this run? Its pods are stopped.")) event.preventDefault();
  });
});
