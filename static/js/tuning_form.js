// The tuning form: what every trial runs (the algorithm, its fixed hyperparameters and
// data, generated from the algorithm's schema as on the job form), the ranges editor, the
// objective (a metric the algorithm reports) and the search settings. It sends the tuning
// job as JSON to POST /api/v1/tuning-jobs/, puts the API's field errors (nested or dotted:
// parameter_ranges.lr.min, base_job.inputs.train, objective.metric) next to their inputs,
// then opens the tuning job's page. ?from_job=<id> arrives as `prefill`: the job's spec,
// ranges proposed around its values and the algorithm's default objective.
(function () {
  "use strict";

  var api = window.Trainyard.apiForm, make = api.make, el = api.el, option = api.option, display = api.display;
  var page = api.formPage("tuning-form", "tuning-form-data");
  if (!page) return;
  var form = page.form, data = page.data, algorithms = page.algorithms;
  var prefill = data.prefill, scriptMode = Boolean(prefill && !prefill.job.algorithm);
  var topError = page.topError, hpGrid = page.hpGrid, channelBox = page.channelBox;
  var rangeBox = el("range-rows");
  var metricSelect = el("id_objective_metric");
  var metricText = el("id_objective_metric_text");
  var submit = el("tuning-submit");
  var typed = {};  // fixed values the user typed, kept across algorithm switches
  var base = prefill ? prefill.base_job : {};

  function spec() { return scriptMode ? null : algorithms[form.elements.algorithm.value]; }

  function sameAlgorithmAsSource() {
    return Boolean(prefill && !scriptMode && prefill.job.algorithm === form.elements.algorithm.value);
  }

  // --- ranges editor ------------------------------------------------------------------------
  function tunedNames() {
    return Array.prototype.map.call(rangeBox.querySelectorAll(".range-row"), function (row) {
      return row.querySelector(".range-name").value.trim();
    }).filter(Boolean);
  }

  function schemaHp(name) {
    var current = spec();
    if (!current) return null;
    return current.hyperparameters.filter(function (hp) { return hp.name === name; })[0] || null;
  }

  // A new row for a schema hyperparameter starts from its type and bounds.
  function rangeFromSchema(hp) {
    if (hp.type === "categorical" || hp.type === "boolean" || (hp.choices && hp.choices.length)) {
      return { type: "categorical", values: hp.type === "boolean" ? [true, false] : hp.choices };
    }
    if (hp.type === "integer") return { type: "integer", min: hp.min, max: hp.max, scale: "linear" };
    if (hp.type === "float") {
      var log = hp.min !== null && hp.min > 0 && hp.max !== null && hp.max / hp.min >= 100;
      return { type: "continuous", min: hp.min, max: hp.max, scale: log ? "log" : "linear" };
    }
    return { type: "categorical", values: [] };
  }

  function showRangeKind(row) {
    var categorical = row.querySelector(".range-type").value === "categorical";
    row.querySelectorAll(".range-number").forEach(function (node) { node.hidden = categorical; });
    row.querySelector(".range-values").hidden = !categorical;
    row.querySelector(".range-scale").disabled = categorical;
  }

  function rangeRow(name, range) {
    range = range || { type: "continuous", scale: "linear" };
    var row = make("div", { className: "field range-row", "data-field": "parameter_ranges." + name, "data-range": name });
    var controls = make("div", { className: "range-controls" });
    var nameInput = make("input", { type: "text", className: "mono range-name", "aria-label": "Hyperparameter name",
                                    placeholder: "learning_rate", spellcheck: "false", autocomplete: "off", list: "hyperparameter-names" });
    nameInput.value = name;
    var type = make("select", { className: "range-type", "aria-label": "Type" });
    option(type, "continuous", "continuous", range.type);
    option(type, "integer", "integer", range.type);
    option(type, "categorical", "categorical", range.type);
    var min = make("input", { type: "number", step: "any", className: "mono range-min range-number", "aria-label": "Min", placeholder: "min" });
    var max = make("input", { type: "number", step: "any", className: "mono range-max range-number", "aria-label": "Max", placeholder: "max" });
    var step = make("input", { type: "number", step: "any", min: "0", className: "mono range-step range-number",
                               "aria-label": "Step (optional)", placeholder: "any" });
    min.value = display(range.min);
    max.value = display(range.max);
    step.value = display(range.step);
    var values = make("input", { type: "text", className: "mono range-values", "aria-label": "Values, comma-separated",
                                 placeholder: "adam, sgd", spellcheck: "false", autocomplete: "off" });
    values.value = (range.values || []).map(display).join(", ");
    var scale = make("select", { className: "range-scale", "aria-label": "Scale" });
    option(scale, "linear", "linear", range.scale || "linear");
    option(scale, "log", "log", range.scale);
    var remove = make("button", { type: "button", className: "button button--small button--ghost", "aria-label": "Remove " + (name || "row") }, "Remove");
    remove.addEventListener("click", function () { row.remove(); renderHyperparameters(); });
    [nameInput, type, min, max, step, values, scale, remove].forEach(function (node) { controls.appendChild(node); });
    row.appendChild(controls);
    api.errorSlot(row);
    type.addEventListener("change", function () { showRangeKind(row); });
    nameInput.addEventListener("change", function () {
      var fresh = nameInput.value.trim();
      row.setAttribute("data-field", "parameter_ranges." + fresh);
      row.setAttribute("data-range", fresh);
      var hp = schemaHp(fresh);
      // A schema hyperparameter typed into an empty row brings its type and bounds.
      if (hp && !min.value && !max.value && !values.value) {
        var proposal = rangeFromSchema(hp);
        type.value = proposal.type;
        min.value = display(proposal.min);
        max.value = display(proposal.max);
        scale.value = proposal.scale || "linear";
        values.value = (proposal.values || []).map(display).join(", ");
        showRangeKind(row);
      }
      renderHyperparameters();
    });
    rangeBox.appendChild(row);
    showRangeKind(row);
    return row;
  }

  function parseValue(raw, hp) {
    if (hp && hp.choices && hp.choices.length) {
      var match = hp.choices.filter(function (choice) { return String(choice) === raw; });
      if (match.length) return match[0];
    }
    if (raw === "true" || raw === "false") return raw === "true";
    if (raw !== "" && isFinite(Number(raw))) return Number(raw);
    return raw;
  }

  function collectRanges(errors) {
    var ranges = {};
    rangeBox.querySelectorAll(".range-row").forEach(function (row) {
      var name = row.querySelector(".range-name").value.trim();
      var type = row.querySelector(".range-type").value;
      var path = "parameter_ranges." + name;
      if (!name) {
        if (row.querySelector(".range-min").value || row.querySelector(".range-values").value) {
          row.setAttribute("data-field", "parameter_ranges.");
          errors["parameter_ranges."] = ["Name the hyperparameter, e.g. learning_rate."];
        }
        return;
      }
      if (ranges[name]) { errors[path] = [name + " has two rows; keep one."]; return; }
      if (type === "categorical") {
        var hp = schemaHp(name);
        ranges[name] = { type: type, values: row.querySelector(".range-values").value.split(",").map(function (part) {
          return part.trim();
        }).filter(Boolean).map(function (raw) { return parseValue(raw, hp); }) };
        return;
      }
      var range = { type: type, scale: row.querySelector(".range-scale").value };
      ["min", "max"].forEach(function (bound) {
        var input = row.querySelector(".range-" + bound);
        if (input.validity && input.validity.badInput) { errors[path] = ["Enter numbers for min and max."]; return; }
        if (input.value.trim() === "") { errors[path] = ["Give a min and a max."]; return; }
        range[bound] = Number(input.value);
      });
      // A step makes a range discrete (a grid search needs that of continuous ranges).
      var step = row.querySelector(".range-step");
      if (step.validity && step.validity.badInput) errors[path] = ["Enter a number for the step, or leave it empty."];
      else if (step.value.trim() !== "") range.step = Number(step.value);
      ranges[name] = range;
    });
    return ranges;
  }

  function fillNameList() {
    var list = el("hyperparameter-names");
    list.textContent = "";
    var current = spec();
    var names = current ? current.hyperparameters.filter(function (hp) { return hp.type !== "string"; }).map(function (hp) { return hp.name; })
      : Object.keys((prefill && prefill.job.hyperparameters) || {});
    names.forEach(function (name) { list.appendChild(make("option", { value: name })); });
  }

  // --- fixed hyperparameters -----------------------------------------------------------------
  function renderHyperparameters() {
    if (scriptMode) return;
    hpGrid.textContent = "";
    var current = spec();
    var fromSource = sameAlgorithmAsSource() ? base.hyperparameters || {} : {};
    var tuned = tunedNames();
    (current ? current.hyperparameters : []).forEach(function (hp) {
      var id = "hp-" + hp.name;
      var value = hp.name in typed ? typed[hp.name] : hp.name in fromSource ? fromSource[hp.name] : hp.default;
      var input = api.hyperparameterInput(hp, id, value, typed);
      var searched = tuned.indexOf(hp.name) !== -1;
      var help = searched ? make("p", { className: "help" }) : api.schemaHelp(hp, false);
      if (searched) {
        input.disabled = true;
        help.appendChild(make("span", { className: "tag" }, "searched"));
        help.appendChild(document.createTextNode(" each trial gets its own value"));
      }
      var field = api.hyperparameterField("base_job.hyperparameters." + hp.name, hp, input, help);
      if (searched) field.classList.add("is-tuned");
      hpGrid.appendChild(field);
    });
    var description = el("algorithm-description");
    if (description) description.textContent = current ? current.description : "";
  }

  function collectHyperparameters(errors) {
    var tuned = tunedNames();
    if (scriptMode) {
      var parsed = api.parseLines(el("id_script_hyperparameters").value, "name=value");
      if (parsed.problems.length) errors["base_job.hyperparameters"] = parsed.problems;
      var fixed = {};
      Object.keys(parsed.values).forEach(function (name) {
        if (tuned.indexOf(name) === -1) fixed[name] = api.decodeValue(parsed.values[name]);
      });
      return fixed;
    }
    var current = spec();
    return api.collectSchemaValues(current ? current.hyperparameters : [], "base_job.hyperparameters.", errors,
                                   function (name) { return tuned.indexOf(name) !== -1; });
  }

  // --- data channels ----------------------------------------------------------------------------
  function channelRow(channel, kind, chosen) {
    api.channelRow(channelBox, "base_job.inputs.", channel, kind, chosen, { versions: api.versionsOfProject(form, data.versions) });
  }

  function renderChannels(keep) {
    var previous = keep ? api.currentChoices(channelBox) : base.inputs || {};
    channelBox.textContent = "";
    var versions = api.versionsOfProject(form, data.versions);
    el("no-versions").hidden = versions.length > 0;
    var fallback = api.fallbackChoice(versions);
    if (scriptMode) {
      Object.keys(previous).forEach(function (name) { channelRow(name, "required", previous[name]); });
      return;
    }
    var current = spec();
    var channels = current ? current.channels : { required: [], optional: [] };
    channels.required.forEach(function (name) { channelRow(name, "required", previous[name] || fallback); });
    channels.optional.forEach(function (name) { channelRow(name, "optional", previous[name]); });
  }

  // --- objective --------------------------------------------------------------------------------
  function metricNames() {
    var current = spec();
    if (current) return current.metric_names;
    return ((base.metric_definitions || []).map(function (d) { return d.name; })).filter(Boolean);
  }

  function renderMetrics(wanted) {
    var names = metricNames();
    var current = spec();
    var chosen = wanted || (current && current.default_objective ? current.default_objective.metric : names[0]);
    metricSelect.textContent = "";
    names.forEach(function (name) { option(metricSelect, name, name, chosen); });
    // A script reports what its metric definitions read: a free text field with suggestions.
    metricSelect.hidden = scriptMode;
    metricText.hidden = !scriptMode;
    if (scriptMode) {
      var list = el("metric-names");
      list.textContent = "";
      names.forEach(function (name) { list.appendChild(make("option", { value: name })); });
      if (!metricText.value) metricText.value = chosen || "";
      metricText.id = "id_objective_metric";
      metricSelect.removeAttribute("id");
    }
  }

  function objectiveGoalFor(algorithmName) {
    var current = algorithms[algorithmName];
    if (current && current.default_objective) form.elements.objective_goal.value = current.default_objective.goal;
  }

  // --- warm start -------------------------------------------------------------------------------
  function renderWarmStart() {
    var box = el("warm-start-list");
    var ticked = Array.prototype.map.call(box.querySelectorAll("input:checked"), function (input) { return input.value; });
    box.textContent = "";
    var slug = form.elements.project.value;
    var earlier = data.warm_start.filter(function (job) { return job.project === slug; });
    earlier.forEach(function (job) {
      var label = make("label", { className: "check-row" });
      var input = make("input", { type: "checkbox", name: "warm_start_from", value: String(job.id) });
      input.checked = ticked.indexOf(String(job.id)) !== -1;
      label.appendChild(input);
      label.appendChild(make("span", { className: "strong" }, job.name));
      label.appendChild(make("span", { className: "muted small mono" }, " #" + job.id));
      label.appendChild(make("span", { className: "muted small" }, " · " + job.status.replace("InProgress", "in progress").toLowerCase() +
        (job.metric ? " · " + job.metric : "") + (job.parameters.length ? " · " + job.parameters.join(", ") : "")));
      box.appendChild(label);
    });
    el("warm-start-none").hidden = earlier.length > 0;
  }

  // --- submit -------------------------------------------------------------------------------------
  // A bound's error lands on its range row: say which bound (unless the message does), and
  // mark its input.
  function boundDetail(field, path, detail) {
    var rest = path.slice(field.getAttribute("data-field").length + 1);
    var input = /^[a-z]+$/.test(rest) ? field.querySelector(".range-" + rest) : null;
    if (input) { input.classList.add("has-error-input"); field.classList.add("has-bound-error"); }
    if (rest && detail.toLowerCase().indexOf(rest.toLowerCase()) !== 0) detail = rest + ": " + detail;
    return detail;
  }

  var wholeNumber = api.wholeNumber;

  // The base job: the source job's settings the form does not show (distribution,
  // environment, tags, retries…) are kept as they were; the shown ones replace them.
  function buildBaseJob(errors) {
    var job = {};
    Object.keys(base).forEach(function (key) { job[key] = base[key]; });
    if (scriptMode) {
      job.script = base.script;
    } else {
      job.algorithm = form.elements.algorithm.value;
      delete job.script;
      delete job.metric_definitions;
      if (!sameAlgorithmAsSource()) { delete job.pipeline; job.distribution = "none"; }
    }
    job.hyperparameters = collectHyperparameters(errors);
    job.inputs = api.collectInputs(channelBox, "base_job.inputs.", errors);
    job.resources = {};
    Object.keys(base.resources || {}).forEach(function (key) { job.resources[key] = base.resources[key]; });
    job.resources.instance_type = form.elements.instance_type.value;
    job.stopping = {};
    var runtime = wholeNumber("id_trial_max_runtime_seconds", "base_job.stopping.max_runtime_seconds", errors);
    if (runtime !== undefined) job.stopping.max_runtime_seconds = runtime;
    return job;
  }

  function buildBody(errors) {
    var metric = scriptMode ? metricText.value.trim() : metricSelect.value;
    var body = {
      project: form.elements.project.value,
      name: form.elements.name.value,
      base_job: buildBaseJob(errors),
      parameter_ranges: collectRanges(errors),
      objective: { metric: metric, goal: form.elements.objective_goal.value },
      strategy: form.elements.strategy.value,
      early_stopping: form.elements.early_stopping.value,
      target_value: null,
      max_runtime_seconds: null,
      warm_start_from: Array.prototype.map.call(el("warm-start-list").querySelectorAll("input:checked"), function (input) {
        return Number(input.value);
      }),
    };
    ["max_trials", "max_parallel", "max_runtime_seconds"].forEach(function (name) {
      var value = wholeNumber("id_" + name, name, errors);
      if (value !== undefined) body[name] = value;
    });
    var target = el("id_target_value");
    if (target.validity && target.validity.badInput) errors.target_value = ["Enter a number."];
    else if (target.value.trim() !== "") body.target_value = Number(target.value);
    return body;
  }

  // --- wiring -------------------------------------------------------------------------------------
  // Hyperband is a search and an early-stopping rule in one: its pruner decides.
  function showHelp() {
    var hyperband = form.elements.strategy.value === "hyperband";
    var stopping = form.elements.early_stopping;
    if (hyperband) stopping.value = "hyperband";
    Array.prototype.forEach.call(stopping.options, function (choice) { choice.disabled = hyperband && choice.value !== "hyperband"; });
    el("strategy-help").textContent = data.strategy_help[form.elements.strategy.value] || "";
    el("early-stopping-help").textContent = "Early stopping: " + (data.early_stopping_help[form.elements.early_stopping.value] || "");
  }

  function keptNote() {
    if (!prefill) return;
    var parts = [];
    if (base.distribution && base.distribution !== "none") parts.push("distribution " + base.distribution);
    var env = Object.keys(base.environment || {}).length;
    if (env) parts.push(env + " environment variable" + (env === 1 ? "" : "s"));
    if ((base.tags || []).length) parts.push("tags " + base.tags.join(", "));
    if (base.retries) parts.push(base.retries + " retr" + (base.retries === 1 ? "y" : "ies"));
    if (base.keep_alive_seconds) parts.push("keep warm " + base.keep_alive_seconds + " s");
    if ((base.resources || {}).instance_count > 1) parts.push(base.resources.instance_count + " nodes per trial");
    if (!parts.length) return;
    var note = el("kept-note");
    note.textContent = "Also as in job #" + prefill.job.id + ": " + parts.join(" · ") + ".";
    note.hidden = false;
  }

  form.addEventListener("submit", api.submitter(form, topError, {
    build: buildBody, button: submit, opening: "Submitted; opening the tuning job…", pageBase: data.detail_url_base,
    refused: "The tuning job was refused.", detail: boundDetail,
  }));
  if (!scriptMode) {
    form.elements.algorithm.addEventListener("change", function () {
      api.clearErrors(form, topError);
      renderHyperparameters();
      renderChannels(true);
      renderMetrics(null);
      objectiveGoalFor(form.elements.algorithm.value);
      fillNameList();
    });
  }
  form.elements.project.addEventListener("change", function () { renderChannels(false); renderWarmStart(); });
  form.elements.strategy.addEventListener("change", showHelp);
  form.elements.early_stopping.addEventListener("change", showHelp);
  el("add-range").addEventListener("click", function () { rangeRow("", null).querySelector(".range-name").focus(); });

  if (scriptMode) {
    hpGrid.hidden = true;
    el("fixed-help").textContent = "The same in every trial; searched names are left out.";
    el("script-hyperparameters").hidden = false;
    el("id_script_hyperparameters").value = Object.keys(base.hyperparameters || {}).map(function (name) {
      return name + "=" + display(base.hyperparameters[name]);
    }).join("\n");
  }
  var ranges = prefill ? prefill.parameter_ranges : {};
  Object.keys(ranges).forEach(function (name) { rangeRow(name, ranges[name]); });
  if (!rangeBox.children.length) rangeRow("", null);
  fillNameList();
  renderHyperparameters();
  renderChannels(false);
  renderMetrics(prefill ? prefill.objective.metric : null);
  if (!prefill && !scriptMode) objectiveGoalFor(form.elements.algorithm.value);
  renderWarmStart();
  showHelp();
  keptNote();
})();
