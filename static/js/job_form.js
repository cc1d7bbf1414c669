// The job form: generates the hyperparameter fields and the channel pickers from the
// chosen algorithm's schema, uploads a custom script to POST /api/v1/scripts/, sends the
// job as JSON to POST /api/v1/jobs/, puts the API's field errors (dotted paths such as
// hyperparameters.epochs, inputs.train or pipeline.stages) next to their inputs, then opens
// the job's page. Pipeline settings show only for distribution "pipeline".
(function () {
  "use strict";

  var api = window.Trainyard.apiForm, make = api.make, el = api.el;
  var page = api.formPage("job-form", "job-form-data");
  if (!page) return;
  var form = page.form, data = page.data, clone = data.clone, algorithms = page.algorithms;
  var topError = page.topError, hpGrid = page.hpGrid, channelBox = page.channelBox;
  var metricRows = el("metric-rows");
  var scriptFile = el("id_script_file");
  var scriptSummary = el("script-summary");
  var submit = el("job-submit");
  var typed = {};  // hyperparameter values the user typed, kept when they switch algorithms and back
  // A tag's error names the tag as typed, beside its place in the list: "tags[2] 'x y': …".
  var ERRORS = { refused: "The job was refused.", detail: function (field, path, detail) {
    var item = /^tags\.(\d+)$/.exec(path);
    if (!item) return detail;
    var typed = form.elements.tags.value.split(",").map(function (t) { return t.trim(); }).filter(Boolean)[Number(item[1])];
    return typed === undefined ? detail : detail.replace(/^tags\[\d+\]/, "$& '" + typed + "'");
  } };
  var script = clone && clone.script ? { uri: clone.script.uri, entry_point: clone.script.entry_point } : null;

  function mode() { return form.querySelector('input[name="run_mode"]:checked').value; }
  function spec() { return mode() === "algorithm" ? algorithms[form.elements.algorithm.value] : null; }

  // --- hyperparameters ------------------------------------------------------------------
  // label_column and text_column decide which data fits.
  function onHyperparameterInput(hp) {
    if (hp.name === "label_column" || hp.name === "text_column") markVersions();
  }

  function renderHyperparameters() {
    hpGrid.textContent = "";
    var current = spec();
    var fromClone = clone && current && clone.algorithm === current.name ? clone.hyperparameters || {} : {};
    (current ? current.hyperparameters : []).forEach(function (hp) {
      var id = "hp-" + hp.name;
      var value = hp.name in typed ? typed[hp.name] : hp.name in fromClone ? fromClone[hp.name] : hp.default;
      var input = api.hyperparameterInput(hp, id, value, typed, onHyperparameterInput);
      hpGrid.appendChild(api.hyperparameterField("hyperparameters." + hp.name, hp, input, api.schemaHelp(hp, true)));
    });
    el("algorithm-description").textContent = current ? current.description : "";
  }

  function collectHyperparameters(errors) {
    var values = {};
    if (mode() === "script") {
      var parsed = api.parseLines(el("id_script_hyperparameters").value, "name=value");
      if (parsed.problems.length) errors.hyperparameters = parsed.problems;
      Object.keys(parsed.values).forEach(function (name) { values[name] = api.decodeValue(parsed.values[name]); });
      return values;
    }
    var current = spec();
    return api.collectSchemaValues(current ? current.hyperparameters : [], "hyperparameters.", errors);
  }

  // --- channels ---------------------------------------------------------------------------
  function channelsOf(current) {
    if (!current) return { required: [], optional: [] };
    var channels = current.channels || { required: current.required_channels || [], optional: current.optional_channels || [] };
    return { required: channels.required || [], optional: channels.optional || [] };
  }

  function versionsOfProject() { return api.versionsOfProject(form, data.versions); }

  // --- which data an algorithm can use ---------------------------------------------------
  // Mirrors data_problem in algorithms/base.py (same checks, same words), so the form
  // marks a version the API would refuse for this channel: {message, short} or null.
  var FORMAT_NAMES = { csv: "CSV", jsonl: "JSON Lines", image_folder: "image folders", text: "plain text" };
  var LABEL_NAMES = ["label", "target", "class", "y", "category"];

  function listed(names) {
    var shown = names.slice(0, 8).join(", ");
    return names.length > 8 ? shown + " and " + (names.length - 8) + " more" : shown;
  }

  function pyRepr(text) { return text.indexOf("'") >= 0 && text.indexOf('"') < 0 ? '"' + text + '"' : "'" + text.replace(/'/g, "\\'") + "'"; }

  function dataProblem(current, channel, facts, hps, channelMode) {
    var accepts = current.accepts || {};
    if (current.formats.indexOf(facts.format) < 0) {
      var wanted = current.formats.map(function (f) { return FORMAT_NAMES[f] || f; }).join(" or ");
      return { short: "it is " + (FORMAT_NAMES[facts.format] || facts.format || "of unknown format") + "; needs " + wanted,
               message: facts.name + " is " + (FORMAT_NAMES[facts.format] || facts.format || "of unknown format") + "; " +
                        current.name + " reads " + wanted + "." };
    }
    var extensions = accepts.extensions || [];
    if (extensions.length && (channelMode === "file" || facts.format === "image_folder") && facts.extensions.length &&
        !facts.extensions.some(function (e) { return extensions.indexOf(e) >= 0; })) {
      return { short: "only " + listed(facts.extensions) + " files",
               message: facts.name + " has only " + listed(facts.extensions) + " files; " + current.name + " reads " +
                        listed(extensions) + " files." };
    }
    var tabular = facts.format === "csv" || facts.format === "jsonl";
    var label = tabular ? String(hps.label_column || "") : facts.label_column;
    if (accepts.label && tabular) {
      if (!label) {
        return { short: "no label column",
                 message: facts.name + " has no label column: none of its columns (" + listed(facts.columns) + ") is named " +
                          LABEL_NAMES.join(", ") + " and none was given at upload. Set hyperparameters.label_column, or " +
                          "upload it again with the label column." };
      }
      if (facts.columns.indexOf(label) < 0) {
        return { short: "no column " + pyRepr(label),
                 message: facts.name + " has no column " + pyRepr(label) + " (label_column); its columns are " + listed(facts.columns) + "." };
      }
    }
    if (accepts.text_column && tabular) {
      var text = String(hps[accepts.text_column] || "");
      if (facts.columns.indexOf(text) < 0) {
        return { short: "no text column " + pyRepr(text),
                 message: facts.name + " has no column " + pyRepr(text) + " (" + accepts.text_column + "); its columns are " +
                          listed(facts.columns) + ". Set hyperparameters." + accepts.text_column + "." };
      }
    }
    if (accepts.features && tabular && !facts.columns.some(function (c) { return c !== label; })) {
      return { short: "no feature columns", message: facts.name + " has no feature columns besides the label " + pyRepr(label) + "." };
    }
    if (accepts.label && channel === "train" && label && label === facts.label_column && facts.classes !== null && facts.classes < 2) {
      var found = facts.classes ? "only " + pyRepr(String(facts.only_class)) : "no labels";
      return { short: "one class only", message: facts.name + " has " + found + " in " + pyRepr(label) + ": a classifier needs at least two classes." };
    }
    return null;
  }

  function versionById(id) {
    return data.versions.filter(function (v) { return String(v.id) === String(id); })[0] || null;
  }

  // The values submit would check with: what the form sends (typed, cloned or default),
  // with an empty label_column filled in from the train version's validation and an
  // untyped text_column from the text column given at its upload, as
  // jobs.actions.check_algorithm does. `own`: the version being judged, for train.
  function hyperparametersFor(current, channel, own) {
    var values = {};
    current.hyperparameters.forEach(function (hp) {
      var input = el("hp-" + hp.name);
      values[hp.name] = input ? input.value : hp.default;
    });
    var trainSelect = channelBox.querySelector('.channel-row[data-channel="train"] .channel-version');
    var train = channel === "train" ? own : (trainSelect && versionById(trainSelect.value)) || own;
    if ("label_column" in values && values.label_column === "") values.label_column = train.facts.label_column;
    if ("text_column" in values && !("text_column" in typed) && train.text_column) values.text_column = train.text_column;
    return values;
  }

  function problemFor(v, channel, channelMode) {
    var current = spec();
    if (!current) return null;  // a script reads whatever it likes
    var read = channelsOf(current);
    if (read.required.indexOf(channel) < 0 && read.optional.indexOf(channel) < 0) return null;
    return dataProblem(current, channel, v.facts, hyperparametersFor(current, channel, v), channelMode);
  }

  // An untyped text_column follows the train version's text column (given at upload), so
  // what the form sends is what the check above assumed.
  function followTextColumn() {
    var input = el("hp-text_column");
    var trainSelect = channelBox.querySelector('.channel-row[data-channel="train"] .channel-version');
    var train = trainSelect && versionById(trainSelect.value);
    if (input && !("text_column" in typed) && train && train.text_column) input.value = train.text_column;
  }

  // Disable (and say why) every version the chosen algorithm cannot use in that channel.
  function markVersions() {
    followTextColumn();
    channelBox.querySelectorAll(".channel-row").forEach(function (row) {
      var select = row.querySelector(".channel-version");
      var channel = api.channelName(row);
      var channelMode = row.querySelector(".channel-mode").value;
      var chosenProblem = null;
      Array.prototype.forEach.call(select.options, function (option) {
        var v = versionById(option.value);
        if (!v) return;
        var problem = problemFor(v, channel, channelMode);
        option.disabled = Boolean(problem);
        option.textContent = option.getAttribute("data-label") + (problem ? " — unusable: " + problem.short : "");
        if (problem) { option.title = problem.message; option.setAttribute("data-unusable", problem.message); }
        else { option.removeAttribute("title"); option.removeAttribute("data-unusable"); }
        if (problem && option.selected) chosenProblem = problem;
      });
      var note = row.querySelector(".channel-unusable");
      note.hidden = !chosenProblem;
      note.textContent = chosenProblem ? chosenProblem.message : "";
    });
  }

  function usable(v, channel) { return !problemFor(v, channel, "file"); }

  function channelRow(channel, kind, chosen) {
    api.channelRow(channelBox, "inputs.", channel, kind, chosen, { versions: versionsOfProject(), onChange: markVersions, note: true });
  }

  function renderChannels(keep) {
    var previous = keep ? api.currentChoices(channelBox) : clone ? clone.inputs || {} : {};
    channelBox.textContent = "";
    var versions = versionsOfProject();
    el("no-versions").hidden = versions.length > 0;
    // With one dataset in the project (that this algorithm can train on), a required
    // channel defaults to its newest usable version.
    var fitting = mode() === "script" ? versions : versions.filter(function (v) { return usable(v, "train"); });
    var fallback = api.fallbackChoice(fitting);
    if (mode() === "script") {
      var names = Object.keys(previous);
      if (!names.length) names = ["train"];
      names.forEach(function (name) { channelRow(name, "custom", previous[name] || (name === "train" ? fallback : null)); });
    } else {
      var channels = channelsOf(spec());
      // A choice kept from another algorithm that this one cannot use is dropped.
      var kept = function (name) {
        var choice = previous[name];
        var v = choice && versionById(choice.dataset_version);
        return keep && v && !usable(v, name) ? null : choice;
      };
      channels.required.forEach(function (name) { channelRow(name, "required", kept(name) || fallback); });
      channels.optional.forEach(function (name) { channelRow(name, "optional", kept(name)); });
    }
    el("add-channel").hidden = mode() !== "script";
    markVersions();
  }

  // --- custom script ------------------------------------------------------------------------
  function metricRow(definition) {
    var row = make("div", { className: "pair-row" });
    var name = make("input", { type: "text", className: "mono metric-name", placeholder: "loss", "aria-label": "Metric name", spellcheck: "false" });
    var regex = make("input", { type: "text", className: "mono metric-regex", placeholder: "loss=([0-9.eE+-]+)", "aria-label": "Regex", spellcheck: "false" });
    name.value = definition ? definition.name : "";
    regex.value = definition ? definition.regex : "";
    var remove = make("button", { type: "button", className: "button button--small button--ghost", "aria-label": "Remove metric" }, "Remove");
    remove.addEventListener("click", function () { row.remove(); });
    row.appendChild(name); row.appendChild(regex); row.appendChild(remove);
    metricRows.appendChild(row);
  }

  function collectMetricDefinitions() {
    var out = [];
    metricRows.querySelectorAll(".pair-row").forEach(function (row) {
      var name = row.querySelector(".metric-name").value.trim();
      var regex = row.querySelector(".metric-regex").value;
      if (name || regex) out.push({ name: name, regex: regex });
    });
    return out;
  }

  function uploadScript() {
    var file = scriptFile.files && scriptFile.files[0];
    if (!file) return;
    api.clearError(form, "script.uri");
    script = null;
    scriptSummary.textContent = "Uploading " + file.name + "…";
    var body = new FormData();
    body.append("project", form.elements.project.value);
    body.append("file", file, file.name);
    api.request(form, form.getAttribute("data-scripts-url"), body).then(function (result) {
      if (!result.ok) {
        scriptSummary.textContent = "";
        api.showErrors(form, topError, result.error, { "script.uri": result.fields.file || [result.error.message] }, ERRORS);
        return;
      }
      script = { uri: result.body.uri };
      if (result.body.entry_point && !form.elements.entry_point.value) form.elements.entry_point.value = result.body.entry_point;
      scriptSummary.textContent = "Uploaded " + file.name + " · " + result.body.files.length + " file" +
        (result.body.files.length === 1 ? "" : "s") + " · sha256 " + result.body.sha256.slice(0, 12);
    });
  }

  // --- submit ----------------------------------------------------------------------------------
  var wholeNumber = api.wholeNumber;

  // distribution "pipeline": the API's `pipeline` object. Empty numbers are left out, so the
  // API's defaults (and its "required" message for stages) apply.
  function collectPipeline(errors) {
    var pipeline = { schedule: form.elements.pipeline_schedule.value };
    var stages = wholeNumber("id_pipeline_stages", "pipeline.stages", errors);
    if (stages !== undefined) pipeline.stages = stages;
    var microbatches = wholeNumber("id_pipeline_microbatches", "pipeline.microbatches", errors);
    if (microbatches !== undefined) pipeline.microbatches = microbatches;
    var cap = wholeNumber("id_pipeline_memory_cap_mb", "pipeline.memory_cap_mb", errors);
    if (cap !== undefined) pipeline.memory_cap_mb = cap;
    var partition = form.elements.pipeline_partition.value;
    if (partition !== "manual") {
      pipeline.partition = partition;
      return pipeline;
    }
    var parts = form.elements.pipeline_partition_counts.value.split(/[\s,]+/).filter(Boolean);
    var counts = parts.map(Number);
    if (!parts.length) {
      errors["pipeline.partition"] = ["Give the number of layers of each stage, e.g. 3, 2."];
    } else if (!counts.every(function (n) { return Number.isInteger(n) && n >= 1; })) {
      errors["pipeline.partition"] = ["Use whole numbers of at least 1, separated by commas, e.g. 3, 2."];
    } else {
      pipeline.partition = counts;
    }
    return pipeline;
  }

  function buildBody(errors) {
    var body = {
      project: form.elements.project.value,
      name: form.elements.name.value,
      tags: form.elements.tags.value.split(",").map(function (t) { return t.trim(); }).filter(Boolean),
      hyperparameters: collectHyperparameters(errors),
      inputs: api.collectInputs(channelBox, "inputs.", errors),
      resources: { instance_type: form.elements.instance_type.value },
      distribution: form.elements.distribution.value,
      stopping: {},
      environment: {},
    };
    var count = wholeNumber("id_instance_count", "resources.instance_count", errors);
    if (count !== undefined) body.resources.instance_count = count;
    var perNode = wholeNumber("id_processes_per_node", "resources.processes_per_node", errors);
    if (perNode !== undefined) body.resources.processes_per_node = perNode;
    var runtime = wholeNumber("id_max_runtime_seconds", "stopping.max_runtime_seconds", errors);
    if (runtime !== undefined) body.stopping.max_runtime_seconds = runtime;
    var every = wholeNumber("id_checkpoint_every_steps", "checkpoint.every_steps", errors);
    var uri = form.elements.checkpoint_uri.value.trim();
    if (every !== undefined || uri) body.checkpoint = { every_steps: every || 0, uri: uri };
    ["retries", "keep_alive_seconds", "priority"].forEach(function (name) {
      var value = wholeNumber("id_" + name, name, errors);
      if (value !== undefined) body[name] = value;
    });
    if (body.distribution === "pipeline") body.pipeline = collectPipeline(errors);
    var env = api.parseLines(form.elements.environment.value, "KEY=value");
    if (env.problems.length) errors.environment = env.problems;
    body.environment = env.values;
    var rulesText = form.elements.rules ? form.elements.rules.value.trim() : "";
    if (rulesText) {
      try {
        body.rules = JSON.parse(rulesText);
        if (!Array.isArray(body.rules)) errors.rules = ["Rules are a JSON list: [{\"type\": \"stalled\"}, …]."];
      } catch (e) {
        errors.rules = ["Not JSON: " + e.message];
      }
    }
    if (mode() === "algorithm") {
      body.algorithm = form.elements.algorithm.value;
    } else {
      if (!script) errors["script.uri"] = [scriptFile.files.length ? "Wait for the upload to finish." : "Choose a .py file or a .tar.gz to run."];
      body.script = { uri: script ? script.uri : "", entry_point: form.elements.entry_point.value.trim() };
      body.metric_definitions = collectMetricDefinitions();
    }
    return body;
  }

  // --- wiring -----------------------------------------------------------------------------------
  function showMode() {
    var current = mode();
    form.querySelectorAll(".run-panel").forEach(function (panel) { panel.hidden = panel.getAttribute("data-mode") !== current; });
    hpGrid.hidden = current !== "algorithm";
    el("hyperparameters-help").hidden = current !== "algorithm";
    el("hyperparameters-general").hidden = current !== "algorithm";
    el("script-hyperparameters").hidden = current !== "script";
  }

  function limitProcesses() {
    var largest = data.largest_cpus[form.elements.instance_type.value];
    var input = el("id_processes_per_node");
    if (largest) input.setAttribute("max", largest); else input.removeAttribute("max");
    var empty = form.elements.distribution.value === "pipeline"
      ? "Empty: one per stage, spread over the nodes."
      : "Empty: one per GPU, or one on CPU nodes.";
    el("processes-help").textContent = largest
      ? empty + " The largest '" + form.elements.instance_type.value + "' node has " + largest + " CPUs."
      : empty + " No node of this type is running yet.";
  }

  // The distributions the chosen algorithm supports (a script may use any); an unsupported
  // choice falls back to the first supported one rather than failing on submit.
  function limitDistributions() {
    var current = spec();
    var supported = current && current.distributions ? current.distributions : null;
    var select = form.elements.distribution;
    Array.prototype.forEach.call(select.options, function (option) {
      option.disabled = supported !== null && supported.indexOf(option.value) === -1;
      option.title = option.disabled ? current.name + " does not support this" : "";
    });
    if (select.selectedOptions[0] && select.selectedOptions[0].disabled) {
      var first = Array.prototype.filter.call(select.options, function (option) { return !option.disabled; })[0];
      if (first) select.value = first.value;
    }
    showDistribution();
  }

  function showDistribution() {
    var value = form.elements.distribution.value;
    el("distribution-help").textContent = (data.distribution_help || {})[value] || "";
    el("pipeline-fields").hidden = value !== "pipeline";
    el("partition-counts").hidden = form.elements.pipeline_partition.value !== "manual";
    limitProcesses();
  }

  form.addEventListener("submit", api.submitter(form, topError, {
    build: buildBody, button: submit, opening: "Submitted; opening the job…", pageBase: data.job_url_base, refused: ERRORS.refused, detail: ERRORS.detail,
  }));
  form.elements.algorithm.addEventListener("change", function () {
    api.clearErrors(form, topError); renderHyperparameters(); renderChannels(true); limitDistributions();
  });
  form.elements.project.addEventListener("change", function () { renderChannels(false); uploadScript(); });
  form.elements.instance_type.addEventListener("change", limitProcesses);
  form.elements.distribution.addEventListener("change", showDistribution);
  form.elements.pipeline_partition.addEventListener("change", function () {
    showDistribution();
    if (form.elements.pipeline_partition.value === "manual") form.elements.pipeline_partition_counts.focus();
  });
  form.querySelectorAll('input[name="run_mode"]').forEach(function (radio) {
    radio.addEventListener("change", function () {
      api.clearErrors(form, topError); showMode(); renderHyperparameters(); renderChannels(true); limitDistributions();
    });
  });
  scriptFile.addEventListener("change", uploadScript);
  el("add-metric").addEventListener("click", function () { metricRow(null); });
  el("add-channel").addEventListener("click", function () { channelRow("", "custom", null); });

  if (clone && !clone.algorithm && clone.script) {
    form.querySelector('input[name="run_mode"][value="script"]').checked = true;
    scriptSummary.textContent = "Runs the script of job #" + clone.id + ": " + clone.script.uri;
    el("id_script_hyperparameters").value = Object.keys(clone.hyperparameters || {}).map(function (name) {
      var value = clone.hyperparameters[name];
      return name + "=" + (typeof value === "string" ? value : JSON.stringify(value));
    }).join("\n");
    (clone.metric_definitions || []).forEach(metricRow);
  }
  if (clone && clone.rules && clone.rules.length && form.elements.rules) {
    form.elements.rules.value = JSON.stringify(clone.rules, null, 1);
  }
  if (!metricRows.children.length) metricRow(null);
  showMode();
  renderHyperparameters();
  renderChannels(false);
  limitDistributions();
})();
