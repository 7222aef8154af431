// bertserve playground: tabs from GET /models, one form per task, results drawn on the text.
// Every node is built with createElement + textContent (never innerHTML), so no server or user string can
// become markup. Offsets from the server are Unicode code points (Python's str indices), so texts are cut as
// arrays of code points, not UTF-16 strings.
"use strict";

(() => {
  const TASKS = [
    ["classify", "Classify"],
    ["qa", "Question answering"],
    ["ner", "Entities"],
    ["embed", "Embeddings"],
    ["rerank", "Rerank"],
    ["fill-mask", "Fill-mask"],
  ];
  const TIMINGS = [
    ["tokenize", "x-tokenize-time-ms"],
    ["queue", "x-queue-time-ms"],
    ["inference", "x-inference-time-ms"],
    ["postprocess", "x-postprocess-time-ms"],
  ];
  const ENTITY_COLOURS = { PER: 211, ORG: 28, LOC: 145, MISC: 275 };
  const KEY_STORE = "bertserve-playground-key";

  let apiKey = sessionStorage.getItem(KEY_STORE) || "";
  let models = [];

  // ---- DOM helpers ---------------------------------------------------------------------------------
  function el(tag, options = {}, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(options)) {
      if (value === undefined || value === null) continue;
      if (name === "class") node.className = value;
      else if (name === "text") node.textContent = value;
      else if (name.startsWith("data-") || name.startsWith("aria-") || name === "role") node.setAttribute(name, value);
      else node[name] = value;
    }
    for (const child of children) if (child !== null && child !== undefined) node.append(child);
    return node;
  }

  const codePoints = (text) => Array.from(text);
  const slice = (points, start, end) => points.slice(start, end).join("");
  const fixed = (value, digits = 3) => Number(value).toFixed(digits);

  // ---- the API -------------------------------------------------------------------------------------
  class ApiError extends Error {
    constructor(status, code, message, headers) {
      super(message);
      this.status = status;
      this.code = code;
      this.headers = headers;
    }
  }

  async function call(path, body) {
    const headers = {};
    if (body !== undefined) headers["content-type"] = "application/json";
    if (apiKey) headers.authorization = `Bearer ${apiKey}`;
    const started = performance.now();
    let response;
    try {
      response = await fetch(path, {
        method: body === undefined ? "GET" : "POST",
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (error) {
      throw new ApiError(0, "network", `could not reach the server (${error.message})`);
    }
    const text = await response.text();
    const elapsed = performance.now() - started;
    let data = null;
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
    if (!response.ok) {
      const detail = data && data.error ? data.error : null;
      const message = detail ? detail.message : text.trim().slice(0, 500) || response.statusText || "no message";
      throw new ApiError(response.status, detail ? detail.code : "http_error", message, response.headers);
    }
    if (data === null) throw new ApiError(response.status, "bad_response", "the server's answer is not JSON");
    return { data, headers: response.headers, elapsed };
  }

  function errorBox(error) {
    const status = error.status ? `${error.status} ${error.code}` : error.code || "error";
    const box = el("div", { class: "error", role: "alert" },
      el("span", { class: "error-status", text: status }),
      el("span", { class: "error-message", text: error.message }));
    const retry = error.headers && error.headers.get("retry-after");
    if (error.status === 429) box.append(el("div", { text: `The model's queue is full: retry${retry ? ` in ${retry} s` : " shortly"}.` }));
    if (error.status === 401) box.append(el("div", { text: "Enter the server's API key above." }));
    return box;
  }

  // ---- where the time went -------------------------------------------------------------------------
  function timing(headers, elapsed) {
    const number = (name) => {
      const value = parseFloat(headers.get(name));
      return Number.isFinite(value) ? value : null;
    };
    const parts = TIMINGS.map(([name, header]) => [name, number(header)]).filter(([, ms]) => ms !== null);
    const total = number("x-total-time-ms");
    const server = number("x-server-time-ms");
    const measured = parts.reduce((sum, [, ms]) => sum + ms, 0);
    // the rest of the server's time is HTTP, validation and JSON around the task
    if (server !== null && server > measured) parts.push(["http", server - measured]);
    const scale = Math.max(server ?? 0, measured, 1e-6);
    const bar = el("div", { class: "timing-bar", "aria-hidden": "true" });
    const legend = el("ul", { class: "timing-legend" });
    for (const [name, ms] of parts) {
      const segment = el("span", { class: `t-${name}`, title: `${name} ${fixed(ms, 2)} ms` });
      segment.style.width = `${(100 * ms) / scale}%`;
      bar.append(segment);
      legend.append(el("li", {}, el("i", { class: `t-${name}` }), `${name === "http" ? "http & json" : name} ${fixed(ms, 2)} ms`));
    }
    const summary = el("div", { class: "meta-line timing-summary" },
      el("span", {}, "task ", el("strong", { text: total === null ? "?" : `${fixed(total, 2)} ms` })),
      el("span", {}, "server ", el("strong", { text: server === null ? "?" : `${fixed(server, 2)} ms` })),
      el("span", {}, "round trip ", el("strong", { text: `${fixed(elapsed, 1)} ms` })),
      el("span", {}, "backend calls ", el("strong", { text: headers.get("x-backend-calls") ?? "?" })));
    return [summary, bar, legend];
  }

  function meta(headers, elapsed) {
    const name = headers.get("x-model") || "?";
    const model = models.find((m) => m.name === name);
    const line = el("div", { class: "meta-line model-line" },
      el("span", {}, "model ", el("strong", { class: "meta-model", text: name })),
      el("span", {}, "variant ", el("strong", { class: "meta-variant", text: model ? model.variant : "?" })),
      el("span", {}, "backend ", el("strong", { text: model ? model.backend : "?" })));
    const requestId = headers.get("x-request-id");
    if (requestId) line.append(el("span", { class: "request-id" }, "request ", el("code", { text: requestId })));
    return el("div", { class: "meta" }, line, ...timing(headers, elapsed));
  }

  // ---- bars ----------------------------------------------------------------------------------------
  function bars(rows, className) {
    const box = el("div", { class: `bars ${className}` });
    for (const [name, score] of rows) {
      const fill = el("div", { class: "bar-fill" });
      fill.style.width = `${Math.max(0, Math.min(1, score)) * 100}%`;
      box.append(el("div", { class: "bar-row" },
        el("span", { class: "bar-name", text: name, title: name }),
        el("div", { class: "bar-track" }, fill),
        el("span", { class: "bar-score", text: fixed(score) })));
    }
    return box;
  }

  // ---- the tasks: request body from the form, result drawn from the answer --------------------------
  const classify = {
    body(form) {
      const text = form.text.value;
      const pair = form.text_pair.value;
      return { inputs: pair.trim() ? { text, text_pair: pair } : text, top_k: null };
    },
    render(labels) {
      return [bars(labels.map((l) => [l.label, l.score]), "labels")];
    },
  };

  const qa = {
    body(form) {
      return { question: form.question.value, context: form.context.value, top_k: Number(form.top_k.value) || 1 };
    },
    render(answer, body) {
      const answers = (Array.isArray(answer) ? answer : [answer]).filter((a) => a.answer !== "");
      const points = codePoints(body.context);
      const context = el("p", { class: "marked-text context" });
      const list = el("ol", { class: "answers" });
      const show = (index) => {
        const chosen = answers[index];
        context.replaceChildren(slice(points, 0, chosen.start),
          el("mark", { class: "answer", text: slice(points, chosen.start, chosen.end) }),
          slice(points, chosen.end, points.length));
        list.querySelectorAll("button").forEach((b, i) => b.setAttribute("aria-pressed", String(i === index)));
        const mark = context.querySelector("mark");
        context.scrollTop = Math.max(0, mark.offsetTop - context.offsetTop - context.clientHeight / 3);
      };
      if (answers.length === 0) {
        context.textContent = body.context;
        return [el("p", { class: "notice", text: "No answer: the model found no span of the context to read." }), context];
      }
      answers.forEach((a, index) => {
        const button = el("button", { type: "button", "aria-pressed": "false" },
          el("span", { class: "answer-text", text: a.answer }), el("span", { class: "score", text: fixed(a.score) }));
        button.addEventListener("click", () => show(index));
        list.append(el("li", {}, button));
      });
      show(0);
      return [context, list];
    },
  };

  function entityColour(node, group) {
    const type = group.replace(/^[BIES]-/, ""); // aggregation "none" gives token tags: B-PER is coloured as PER
    let hue = ENTITY_COLOURS[type];
    if (hue === undefined) hue = [...type].reduce((h, c) => (h * 31 + c.codePointAt(0)) % 360, 7);
    node.style.setProperty("--entity-bg", `hsl(${hue} 85% 90%)`);
    node.style.setProperty("--entity-line", `hsl(${hue} 60% 38%)`);
    return node;
  }

  const ner = {
    body(form) {
      return { inputs: form.text.value, aggregation_strategy: form.aggregation_strategy.value };
    },
    render(entities, body) {
      const points = codePoints(body.inputs);
      const text = el("p", { class: "marked-text entities" });
      const sorted = [...entities].sort((a, b) => a.start - b.start);
      let cursor = 0;
      for (const entity of sorted) {
        if (entity.start < cursor) continue; // overlapping spans: the first one is drawn, all are listed below
        text.append(slice(points, cursor, entity.start));
        const mark = el("mark", { class: "entity", "data-type": entity.entity_group, title: `${entity.entity_group} ${fixed(entity.score)}`,
          text: slice(points, entity.start, entity.end) });
        text.append(entityColour(mark, entity.entity_group));
        cursor = entity.end;
      }
      text.append(slice(points, cursor, points.length));
      if (entities.length === 0) return [el("p", { class: "notice", text: "No entities found." }), text];
      const counts = new Map();
      for (const entity of entities) counts.set(entity.entity_group, (counts.get(entity.entity_group) || 0) + 1);
      const legend = el("ul", { class: "legend" });
      for (const [type, count] of [...counts].sort()) {
        legend.append(el("li", { "data-type": type }, entityColour(el("span", { class: "swatch" }), type), `${type} × ${count}`));
      }
      const table = el("table", { class: "data" },
        el("thead", {}, el("tr", {}, ...["text", "type", "score", "characters"].map((h) => el("th", { text: h })))));
      const rows = el("tbody");
      for (const entity of sorted) {
        rows.append(el("tr", {},
          el("td", { text: entity.word }), el("td", { text: entity.entity_group }),
          el("td", { class: "num", text: fixed(entity.score) }), el("td", { class: "num", text: `${entity.start}–${entity.end}` })));
      }
      table.append(rows);
      return [legend, text, el("div", { class: "table-box" }, table)];
    },
  };

  function cosine(a, b) {
    let dot = 0, na = 0, nb = 0;
    for (let i = 0; i < a.length; i += 1) {
      dot += a[i] * b[i];
      na += a[i] * a[i];
      nb += b[i] * b[i];
    }
    return na && nb ? dot / Math.sqrt(na * nb) : 0;
  }

  const embed = {
    body(form) {
      const lines = form.sentences.value.split("\n").map((line) => line.trim()).filter((line) => line);
      // nothing typed: send one empty text, so the server's own message says what is wrong
      return { inputs: lines.length ? lines : [""], normalize: true };
    },
    render(vectors, body) {
      const n = vectors.length;
      const table = el("table", { class: "heatmap" });
      const head = el("tr", {}, el("th"));
      for (let j = 0; j < n; j += 1) head.append(el("th", { text: String(j + 1), title: body.inputs[j] }));
      table.append(el("thead", {}, head));
      const rows = el("tbody");
      for (let i = 0; i < n; i += 1) {
        const row = el("tr", {}, el("th", { class: "row-label", text: `${i + 1}  ${body.inputs[i]}`, title: body.inputs[i] }));
        for (let j = 0; j < n; j += 1) {
          const similarity = cosine(vectors[i], vectors[j]);
          const strength = Math.max(0, Math.min(1, similarity));
          const cell = el("td", { text: fixed(similarity, 2), title: `${i + 1} × ${j + 1}: cosine ${fixed(similarity)}` });
          cell.style.backgroundColor = `hsl(222 70% ${Math.round(96 - 58 * strength)}%)`;
          cell.style.color = strength > 0.55 ? "#fff" : "#1d2430";
          row.append(cell);
        }
        rows.append(row);
      }
      table.append(rows);
      const sentences = el("ol", { class: "sentences" }, ...body.inputs.map((s) => el("li", { text: s })));
      const note = el("p", { class: "notice", text: `${n} sentences × ${vectors[0] ? vectors[0].length : 0} dimensions; cell = cosine similarity` });
      return [note, el("div", { class: "heatmap-box" }, table), sentences];
    },
  };

  const fillMask = {
    body(form) {
      return { inputs: form.text.value, top_k: Number(form.top_k.value) || 5 };
    },
    render(result) {
      // one mask: a list of fills; several masks: one list per mask
      const masks = Array.isArray(result[0]) ? result : [result];
      const cards = el("div", { class: "masks" });
      masks.forEach((fills, index) => {
        const card = el("div", { class: "mask-card" }, el("h3", { text: `[MASK] ${index + 1}` }));
        card.append(bars(fills.map((f) => [f.token_str, f.score]), "tokens"));
        if (masks.length === 1 && fills.length) {
          card.append(el("p", { class: "filled" }, "best: ", el("mark", { text: fills[0].sequence })));
        }
        cards.append(card);
      });
      return [cards];
    },
  };

  const rerank = {
    body(form) {
      const passages = form.passages.value.split("\n").map((line) => line.trim()).filter((line) => line);
      // nothing typed: send no passage, so the server's own message says what is wrong
      return { query: form.query.value, texts: passages, return_text: true };
    },
    render(ranks) {
      const list = el("ol", { class: "ranking" });
      for (const rank of ranks) {
        list.append(el("li", { title: `passage ${rank.index + 1}` },
          bars([[`#${rank.index + 1}`, rank.score]], "labels"), el("p", { class: "passage", text: rank.text })));
      }
      const note = el("p", { class: "notice", text: `${ranks.length} passages, most relevant first (score: the model's sigmoid)` });
      return [note, list];
    },
  };

  const RENDERERS = { classify, qa, ner, embed, rerank, "fill-mask": fillMask };
  const PATHS = { classify: "classify", qa: "qa", ner: "ner", embed: "embed", rerank: "rerank", "fill-mask": "fill-mask" };

  // ---- tabs and forms ------------------------------------------------------------------------------
  function select(task) {
    for (const button of document.querySelectorAll("#tabs button")) {
      button.setAttribute("aria-selected", String(button.dataset.task === task));
    }
    for (const panel of document.querySelectorAll(".panel")) panel.hidden = panel.dataset.task !== task;
    if (location.hash !== `#${task}`) history.replaceState(null, "", `#${task}`);
  }

  function buildTabs() {
    const tabs = document.getElementById("tabs");
    tabs.replaceChildren();
    const served = TASKS.filter(([task]) => models.some((m) => m.task === task));
    for (const [task, title] of served) {
      const button = el("button", { type: "button", role: "tab", "data-task": task, text: title, id: `tab-${task}` });
      button.addEventListener("click", () => select(task));
      tabs.append(button);
      const options = models.filter((m) => m.task === task).sort((a, b) => Number(b.is_default) - Number(a.is_default));
      const chooser = document.querySelector(`#panel-${task} select[name=model]`);
      chooser.replaceChildren(...options.map((m) => el("option", { value: m.name, text: `${m.name} (${m.variant})` })));
    }
    if (served.length === 0) {
      setStatus(el("div", { class: "notice" }, "No models are loaded yet (the server may still be loading). ",
        retryButton()));
      return;
    }
    const wanted = location.hash.slice(1);
    select(served.some(([task]) => task === wanted) ? wanted : served[0][0]);
  }

  async function submit(task, form) {
    const panel = form.closest(".panel");
    const result = panel.querySelector(".result");
    const button = form.querySelector("button[type=submit]");
    const renderer = RENDERERS[task];
    const body = { ...renderer.body(form), model: form.model.value || undefined };
    button.disabled = true;
    result.replaceChildren(el("p", { class: "running", text: "Running…" }));
    try {
      const { data, headers, elapsed } = await call(PATHS[task], body);
      result.replaceChildren(...renderer.render(data, body), meta(headers, elapsed));
    } catch (error) {
      result.replaceChildren(errorBox(error instanceof ApiError ? error : new ApiError(0, "error", String(error))));
      if (error.status === 401) showKeyForm();
    } finally {
      button.disabled = false;
    }
  }

  // ---- the API key and the page's status --------------------------------------------------------------
  function setStatus(...nodes) {
    document.getElementById("status").replaceChildren(...nodes.filter((n) => n));
  }

  function retryButton() {
    const button = el("button", { type: "button", class: "retry", text: "Retry" });
    button.addEventListener("click", loadModels);
    return button;
  }

  function showKeyForm() {
    const form = document.getElementById("key-form");
    form.hidden = false;
    form.key.focus();
  }

  async function loadModels() {
    setStatus(el("p", { class: "running", text: "Loading the models…" }));
    try {
      const { data } = await call("models");
      models = data.models;
    } catch (error) {
      models = [];
      buildTabs();
      setStatus(errorBox(error), error.status === 401 ? null : retryButton());
      if (error.status === 401) showKeyForm();
      return;
    }
    setStatus();
    buildTabs();
  }

  function start() {
    for (const [task] of TASKS) {
      const form = document.querySelector(`#panel-${task} form`);
      form.addEventListener("submit", (event) => {
        event.preventDefault();
        submit(task, form);
      });
    }
    document.getElementById("key-form").addEventListener("submit", (event) => {
      event.preventDefault();
      apiKey = event.target.key.value.trim();
      sessionStorage.setItem(KEY_STORE, apiKey);
      loadModels();
    });
    if (apiKey) document.getElementById("key-form").hidden = false;
    loadModels();
  }

  start();
})();
