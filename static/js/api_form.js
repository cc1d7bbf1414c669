// What the forms that post JSON to the API (the job form, the tuning form) share, as
// window.Trainyard.apiForm: building nodes (user data only ever as text), the POST with the
// CSRF token, the API's error envelope flattened to dotted paths (resources.instance_count,
// metric_definitions.0.regex, parameter_ranges.lr.min) and each message placed beside the
// nearest field that shows it, the hyperparameter inputs generated from an algorithm's
// schema, and the data channel rows. Loaded before the page's own script.
(function () {
  "use strict";

  var Trainyard = window.Trainyard = window.Trainyard || {};
  var el = function (id) { return document.getElementById(id); };

  function make(tag, attrs, text) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (key) {
      if (key === "className") node.className = attrs[key];
      else if (attrs[key] !== null && attrs[key] !== undefined) node.setAttribute(key, attrs[key]);
    });
    if (text !== undefined) node.textContent = text;  // user data only ever as text
    return node;
  }

  function errorSlot(field) { field.appendChild(make("p", { className: "field-error", hidden: "" })); }

  function option(select, value, label, chosen) {
    var node = make("option", { value: value }, label);
    if (String(value) === String(chosen)) node.selected = true;
    select.appendChild(node);
    return node;
  }

  function display(value) {
    if (value === null || value === undefined) return "";
    return typeof value === "object" ? JSON.stringify(value) : String(value);
  }

  // "name=value" lines (hyperparameters for a script, KEY=value environment variables);
  // blank lines and # comments are skipped, the values are left as written.
  function parseLines(text, what) {
    var out = {};
    var problems = [];
    text.split("\n").forEach(function (line, index) {
      if (!line.trim() || line.trim().charAt(0) === "#") return;
      var at = line.indexOf("=");
      if (at < 1) { problems.push("Line " + (index + 1) + " is not " + what + "."); return; }
      out[line.slice(0, at).trim()] = line.slice(at + 1);
    });
    return { values: out, problems: problems };
  }

  // A script's hyperparameter: JSON-looking values (5, 0.1, true) keep their type, as
  // SageMaker's training toolkit decodes them for SM_HPS; anything else stays a string.
  function decodeValue(raw) {
    raw = raw.trim();
    try { var decoded = JSON.parse(raw); return typeof decoded === "object" ? raw : decoded; } catch (e) { return raw; }
  }

  function wholeNumber(id, path, errors) {
    var input = el(id);
    if (input.validity && input.validity.badInput) { errors[path] = ["Enter a whole number."]; return undefined; }
    if (input.value.trim() === "") return undefined;
    var number = Number(input.value);
    if (!Number.isInteger(number)) { errors[path] = ["Enter a whole number."]; return undefined; }
    return number;
  }

  // --- request and errors -------------------------------------------------------------------
  // POST JSON (or a FormData, for uploads) with the form's CSRF token; resolves to
  // {ok, body} or {ok: false, error: {message, code, fields}, fields: {dotted path: [messages]}}.
  function request(form, url, body) {
    var json = !(body instanceof FormData);
    var headers = { "X-CSRFToken": form.elements.csrfmiddlewaretoken.value, "Accept": "application/json" };
    if (json) headers["Content-Type"] = "application/json";
    return fetch(url, { method: "POST", headers: headers, credentials: "same-origin", body: json ? JSON.stringify(body) : body })
      .then(function (response) {
        return response.json().catch(function () { return null; }).then(function (payload) {
          if (response.ok) return { ok: true, body: payload };
          var error = (payload && payload.error) || { message: response.status === 403
            ? "You are signed out or your role does not allow this. Reload the page and sign in again."
            : "The server answered " + response.status + ". Try again; if it persists, the server log says why." };
          return { ok: false, error: error, fields: flatten(error.fields || {}) };
        });
      }, function () {
        return { ok: false, error: { message: "The connection broke off. Check the network and try again." }, fields: {} };
      });
  }

  // {"resources": {"processes_per_node": ["…"]}}, {"metric_definitions": [{"regex": ["…"]}]}
  // and {"parameter_ranges.lr.min": ["…"]} become {"resources.processes_per_node": [...],
  // "metric_definitions.0.regex": [...], "parameter_ranges.lr.min": [...]}; non_field_errors
  // belong to the path above them.
  function flatten(value) {
    var out = {};
    function walk(node, path) {
      if (Array.isArray(node) && node.every(function (x) { return typeof x !== "object" || x === null; })) {
        if (node.length) out[path] = (out[path] || []).concat(node.map(String));
      } else if (node && typeof node === "object") {
        Object.keys(node).forEach(function (key) {
          walk(node[key], key === "non_field_errors" ? path : path ? path + "." + key : key);
        });
      } else if (node !== null && node !== undefined) {
        out[path] = (out[path] || []).concat([String(node)]);
      }
    }
    walk(value, "");
    return out;
  }

  // The nearest visible field for a dotted path: "parameter_ranges.lr.min", else
  // "parameter_ranges.lr", else "parameter_ranges".
  function fieldFor(form, path) {
    var parts = path.split(".");
    while (parts.length) {
      var key = parts.join(".");
      var found = Array.prototype.filter.call(form.querySelectorAll(".field[data-field]"), function (field) {
        return field.getAttribute("data-field") === key && !field.closest("[hidden]");
      });
      if (found.length) return found[0];
      parts.pop();
    }
    // A list's item ("rules[2].parameters.window") belongs to the list's field ("rules").
    var list = path.split(/[.[]/)[0];
    return list !== path ? form.querySelector('.field[data-field="' + list + '"]') : null;
  }

  function clearError(form, path) {
    var field = fieldFor(form, path);
    if (!field) return;
    field.classList.remove("has-error");
    var slot = field.querySelector(":scope > .field-error");
    if (slot) { slot.hidden = true; slot.textContent = ""; }
  }

  function clearErrors(form, topError) {
    topError.hidden = true;
    topError.textContent = "";
    form.querySelectorAll(".field.has-error").forEach(function (field) { field.classList.remove("has-error", "has-bound-error"); });
    form.querySelectorAll(".has-error-input").forEach(function (input) { input.classList.remove("has-error-input"); });
    form.querySelectorAll(".field-error").forEach(function (slot) { slot.hidden = true; slot.textContent = ""; });
  }

  // Each path's messages go in its field's slot; what no field shows is listed under the
  // form's message. options.refused: the message when the API gives none; options.detail
  // (field, path, text) may reword a message for its field (and mark a part of it).
  function showErrors(form, topError, error, fields, options) {
    options = options || {};
    var unplaced = [];
    var placedFields = [];  // several paths can land on one field (two bad tags): it counts once
    Object.keys(fields).forEach(function (path) {
      var field = fieldFor(form, path);
      var slot = field && field.querySelector(":scope > .field-error");
      // An item of a list, flattened as "tags.2", reads as the API writes it: "tags[2]".
      var shownPath = path.replace(/\.(\d+)(?=\.|$)/g, "[$1]");
      if (!slot) { unplaced.push((path ? shownPath + ": " : "") + fields[path].join(" ")); return; }
      if (placedFields.indexOf(field) === -1) placedFields.push(field);
      field.classList.add("has-error");
      var detail = fields[path].join(" ");
      // Placed on a list's field for one of its items: say which item and part is wrong.
      if (shownPath.indexOf("[") !== -1 && field.getAttribute("data-field") !== path) detail = shownPath + ": " + detail;
      if (options.detail) detail = options.detail(field, path, detail);
      slot.textContent = (slot.textContent ? slot.textContent + " " : "") + detail;
      slot.hidden = false;
      var details = field.closest("details");
      if (details) details.open = true;
    });
    var message = error.message || options.refused || "The form was refused.";
    var placed = placedFields.length;
    if ((error.code === "invalid" || !error.code) && placed && !unplaced.length) {
      message = placed === 1 ? "Fix the highlighted field and submit again." : "Fix the " + placed + " highlighted fields and submit again.";
    }
    topError.textContent = message;
    if (unplaced.length) {
      var list = make("ul");
      unplaced.forEach(function (text) { list.appendChild(make("li", {}, text)); });
      topError.appendChild(list);
    }
    topError.hidden = false;
    var first = form.querySelector(".has-error input:not([disabled]), .has-error select, .has-error textarea");
    (first || topError).scrollIntoView({ block: "center", behavior: "smooth" });
    if (first) first.focus({ preventScroll: true });
  }

  // The form's submit handler: what options.build(errors) finds wrong is shown without a
  // request; otherwise the body is posted to the form's action and, once created, the new
  // object's page (options.pageBase + id + "/") opens. options.button, options.opening.
  function submitter(form, topError, options) {
    var status = el("submit-status");
    return function (event) {
      event.preventDefault();
      clearErrors(form, topError);
      var errors = {};
      var body = options.build(errors);
      if (Object.keys(errors).length) { showErrors(form, topError, { code: "invalid" }, errors, options); return; }
      options.button.disabled = true;
      status.textContent = "Submitting…";
      request(form, form.getAttribute("action"), body).then(function (result) {
        if (result.ok) {
          status.textContent = options.opening;
          window.location.assign(options.pageBase + result.body.id + "/");
          return;
        }
        options.button.disabled = false;
        status.textContent = "";
        showErrors(form, topError, result.error, result.fields, options);
      });
    };
  }

  // --- hyperparameters ------------------------------------------------------------------------
  // "default 0.01 · 0.0001 to 1"; oneSided adds "at least 1" / "at most 9" for half bounds.
  function rangeText(hp, oneSided) {
    var parts = ["default " + (hp.default === "" ? "empty" : String(hp.default))];
    if (hp.min !== null && hp.max !== null) parts.push(hp.min + " to " + hp.max);
    else if (oneSided && hp.min !== null) parts.push("at least " + hp.min);
    else if (oneSided && hp.max !== null) parts.push("at most " + hp.max);
    return parts.join(" · ");
  }

  // The input for one schema hyperparameter. What the person types is kept in `typed`
  // (so it survives switching algorithms and back); onInput(hp) runs on each keystroke.
  function hyperparameterInput(hp, id, value, typed, onInput) {
    var input;
    if (hp.type === "categorical" || hp.type === "boolean") {
      input = make("select", { id: id });
      (hp.type === "boolean" ? [true, false] : hp.choices).forEach(function (choice) { option(input, String(choice), String(choice), value); });
    } else if (hp.type === "integer" || hp.type === "float") {
      input = make("input", { id: id, type: "number", className: "mono", step: hp.type === "integer" ? "1" : "any",
                              min: hp.min, max: hp.max, inputmode: hp.type === "integer" ? "numeric" : "decimal" });
      input.value = display(value);
    } else {
      input = make("input", { id: id, type: "text", className: "mono", spellcheck: "false", autocomplete: "off" });
      input.value = display(value);
    }
    input.setAttribute("data-hp", hp.name);
    input.addEventListener("input", function () {
      typed[hp.name] = input.value;
      if (onInput) onInput(hp);
    });
    input.addEventListener("change", function () { typed[hp.name] = input.value; });
    return input;
  }

  // The field around it: the name as its label, the input, a help line, an error slot.
  function hyperparameterField(path, hp, input, help) {
    var field = make("div", { className: "field", "data-field": path });
    var label = make("label", { "for": input.id });
    label.appendChild(make("span", { className: "mono" }, hp.name));
    field.appendChild(label);
    field.appendChild(input);
    field.appendChild(help);
    errorSlot(field);
    return field;
  }

  function schemaHelp(hp, oneSided) {
    var help = make("p", { className: "help" });
    if (hp.description) help.appendChild(document.createTextNode(hp.description + " "));
    help.appendChild(make("span", { className: "hp-range" }, rangeText(hp, oneSided)));
    return help;
  }

  function coerce(hp, raw) {
    if (hp.type === "boolean") return raw === "true";
    if (hp.type === "categorical") {
      var match = hp.choices.filter(function (c) { return String(c) === raw; });
      return match.length ? match[0] : raw;
    }
    if (hp.type === "integer" || hp.type === "float") return raw !== "" && isFinite(Number(raw)) ? Number(raw) : raw;
    return raw;
  }

  // The typed values of the schema's inputs ("hp-<name>"), less the names skip(name) leaves
  // out; an empty input means the default. A number input holding no number is an error at
  // path + name.
  function collectSchemaValues(hyperparameters, path, errors, skip) {
    var values = {};
    hyperparameters.forEach(function (hp) {
      if (skip && skip(hp.name)) return;
      var input = el("hp-" + hp.name);
      if (input.validity && input.validity.badInput) { errors[path + hp.name] = ["Enter a number."]; return; }
      if (input.value === "" && hp.type !== "string") return;  // empty: the default
      values[hp.name] = coerce(hp, input.value);
    });
    return values;
  }

  // --- channels -----------------------------------------------------------------------------
  function versionsOfProject(form, versions) {
    var slug = form.elements.project.value;
    return versions.filter(function (v) { return v.project === slug; });
  }

  // With one dataset among the versions, a required channel defaults to its newest version.
  function fallbackChoice(versions) {
    var datasets = versions.map(function (v) { return v.dataset_id; }).filter(function (d, i, all) { return all.indexOf(d) === i; });
    return datasets.length === 1 ? { dataset_version: versions[0].id, mode: "file" } : null;
  }

  function versionSelect(id, chosen, required, versions) {
    var select = make("select", { id: id, className: "channel-version" });
    select.appendChild(make("option", { value: "" }, required ? "Choose a dataset version" : "None"));
    var groups = {};
    versions.forEach(function (v) {
      if (!groups[v.dataset]) { groups[v.dataset] = make("optgroup", { label: v.dataset }); select.appendChild(groups[v.dataset]); }
      var records = v.records === null ? "" : " · " + Number(v.records).toLocaleString() + " records";
      var node = make("option", { value: String(v.id), "data-label": v.dataset + " v" + v.version + records },
                      v.dataset + " v" + v.version + records);
      if (String(v.id) === String(chosen)) node.selected = true;
      groups[v.dataset].appendChild(node);
    });
    return select;
  }

  function modeSelect(id, chosen) {
    var select = make("select", { id: id, className: "channel-mode", "aria-label": "Input mode" });
    option(select, "file", "file (copied to the node)", chosen);
    option(select, "stream", "stream (read while training)", chosen);
    return select;
  }

  // One channel's row in box: kind "required", "optional" or "custom" (a name the person
  // types, and a Remove button); its errors are at path + the channel's name.
  // options: versions (those offered), onChange (a version or mode picked), note (a line
  // for why the chosen version cannot be used).
  function channelRow(box, path, channel, kind, chosen, options) {
    var index = box.children.length;
    var row = make("div", { className: "field channel-row", "data-field": path + channel, "data-channel": channel });
    var head = make("div", { className: "channel-head" });
    if (kind === "custom") {
      var name = make("input", { type: "text", className: "mono channel-name", "aria-label": "Channel name",
                                 placeholder: "channel", spellcheck: "false", autocomplete: "off" });
      name.value = channel;
      name.addEventListener("input", function () { row.setAttribute("data-field", path + name.value.trim()); });
      head.appendChild(name);
    } else {
      head.appendChild(make("label", { "for": "channel-" + index, className: "mono" }, channel));
      head.appendChild(make("span", { className: kind === "required" ? "tag" : "optional" }, kind));
    }
    row.appendChild(head);
    var controls = make("div", { className: "channel-controls" });
    var versions = versionSelect("channel-" + index, chosen ? chosen.dataset_version : "", kind === "required", options.versions);
    var modes = modeSelect("channel-mode-" + index, chosen ? chosen.mode : "file");
    if (options.onChange) { versions.addEventListener("change", options.onChange); modes.addEventListener("change", options.onChange); }
    controls.appendChild(versions);
    controls.appendChild(modes);
    if (kind === "custom") {
      var remove = make("button", { type: "button", className: "button button--small button--ghost", "aria-label": "Remove channel" }, "Remove");
      remove.addEventListener("click", function () { row.remove(); });
      controls.appendChild(remove);
    }
    row.appendChild(controls);
    if (options.note) row.appendChild(make("p", { className: "help channel-unusable", hidden: "" }));
    errorSlot(row);
    box.appendChild(row);
    return row;
  }

  function channelName(row) {
    var input = row.querySelector(".channel-name");
    return input ? input.value.trim() : row.getAttribute("data-channel");
  }

  // {channel: {dataset_version, mode}} of the rows with a version chosen (as the strings the
  // selects hold).
  function currentChoices(box) {
    var chosen = {};
    box.querySelectorAll(".channel-row").forEach(function (row) {
      var version = row.querySelector(".channel-version").value;
      if (version) chosen[channelName(row)] = { dataset_version: version, mode: row.querySelector(".channel-mode").value };
    });
    return chosen;
  }

  // The API's `inputs`: a chosen version in a row without a name is an error at path.
  function collectInputs(box, path, errors) {
    var inputs = {};
    box.querySelectorAll(".channel-row").forEach(function (row) {
      var name = channelName(row);
      var version = row.querySelector(".channel-version").value;
      if (!version) return;
      if (!name) { errors[path] = ["Give the channel a name, e.g. train."]; return; }
      inputs[name] = { dataset_version: Number(version), mode: row.querySelector(".channel-mode").value };
    });
    return inputs;
  }

  // What both form pages start from: the form, its page data, the algorithms by name and
  // the boxes the shared pieces fill; null on a page without the form.
  function formPage(formId, dataId) {
    var form = el(formId);
    var data = Trainyard.pageData(dataId);
    if (!form || !data) return null;
    var algorithms = {};
    data.algorithms.forEach(function (spec) { algorithms[spec.name] = spec; });
    return { form: form, data: data, algorithms: algorithms, topError: el("form-error"),
             hpGrid: el("hyperparameter-fields"), channelBox: el("channel-fields") };
  }

  Trainyard.apiForm = {
    el: el, formPage: formPage,
    make: make, errorSlot: errorSlot, option: option, display: display, parseLines: parseLines,
    decodeValue: decodeValue, wholeNumber: wholeNumber,
    request: request, flatten: flatten, fieldFor: fieldFor, clearError: clearError, clearErrors: clearErrors,
    showErrors: showErrors, submitter: submitter,
    rangeText: rangeText, hyperparameterInput: hyperparameterInput, hyperparameterField: hyperparameterField,
    schemaHelp: schemaHelp, coerce: coerce, collectSchemaValues: collectSchemaValues,
    versionsOfProject: versionsOfProject, fallbackChoice: fallbackChoice, channelRow: channelRow,
    channelName: channelName, currentChoices: currentChoices, collectInputs: collectInputs,
  };
})();
