// The upload page: sends the form to POST /api/v1/datasets/ with XMLHttpRequest (fetch
// cannot report upload progress), shows a real progress bar, puts the API's field errors
// next to their fields, then opens the new version's page.
(function () {
  "use strict";

  var form = document.getElementById("upload-form");
  if (!form) return;

  var FIELDS = ["project", "name", "description", "format", "label_column", "text_column", "delimiter", "split"];
  // API field names that have no input of their own on this page → where to show them.
  var FIELD_ALIASES = { train: "file", validation: "file", test: "file" };
  var maxBytes = parseInt(form.getAttribute("data-max-bytes"), 10) || 0;
  var maxHuman = form.getAttribute("data-max-human") || "";
  var topError = document.getElementById("form-error");
  var submit = document.getElementById("upload-submit");
  var cancel = document.getElementById("upload-cancel");
  var progressBox = document.getElementById("upload-progress");
  var progressBar = document.getElementById("upload-progress-bar");
  var progressText = document.getElementById("upload-progress-text");
  var filesInput = document.getElementById("id_files");
  var folderInput = document.getElementById("id_folder");
  var currentRequest = null;

  // Same units as the server's human_bytes filter (binary, labelled KiB/MiB/GiB).
  function humanBytes(n) {
    if (n < 1024) return n + " B";
    var units = ["KiB", "MiB", "GiB", "TiB"];
    var i = -1;
    do { n /= 1024; i += 1; } while (n >= 1024 && i < units.length - 1);
    return n.toFixed(1) + " " + units[i];
  }

  function mode() {
    var checked = form.querySelector('input[name="source_mode"]:checked');
    return checked ? checked.value : "files";
  }

  function showMode() {
    var current = mode();
    form.querySelectorAll(".source-panel").forEach(function (panel) {
      panel.hidden = panel.getAttribute("data-mode") !== current;
    });
  }

  // A folder picker also returns .DS_Store, Thumbs.db and the like; the API refuses hidden
  // files, so they are left out here, and the user is told.
  function isHidden(path) {
    return path.split("/").some(function (part) { return part.charAt(0) === "." || part === "Thumbs.db"; });
  }

  // The picked folder is the version's root: "pets/cat/001.png" is stored as "cat/001.png",
  // so sub-folders (classes, train/validation) sit at the top of the version as they do on disk.
  function folderEntries() {
    var files = Array.prototype.slice.call(folderInput.files || []);
    var entries = files.map(function (file) {
      var path = file.webkitRelativePath || file.name;
      var slash = path.indexOf("/");
      return { file: file, path: slash === -1 ? path : path.slice(slash + 1) };
    });
    var kept = entries.filter(function (entry) { return !isHidden(entry.path); });
    return { kept: kept, skipped: entries.length - kept.length };
  }

  function summarise(files, skipped, target) {
    var total = 0;
    files.forEach(function (file) { total += file.size; });
    var text = files.length ? files.length + (files.length === 1 ? " file, " : " files, ") + humanBytes(total) : "";
    if (skipped) text += " (" + skipped + " hidden file" + (skipped === 1 ? "" : "s") + " left out)";
    if (maxBytes && total > maxBytes) text += " — more than the " + maxHuman + " limit";
    target.textContent = text;
    return total;
  }

  function clearErrors() {
    var unchanged = document.getElementById("form-unchanged");
    if (unchanged) unchanged.hidden = true;
    topError.hidden = true;
    topError.textContent = "";
    form.querySelectorAll(".field[data-field]").forEach(function (field) {
      field.classList.remove("has-error");
      var slot = field.querySelector(".field-error");
      if (slot) { slot.hidden = true; slot.textContent = ""; }
    });
  }

  function fieldFor(name) {
    var key = FIELD_ALIASES[name] || name;
    if (key === "file" && mode() === "folder") key = "paths";
    if (key === "paths" && mode() === "files") key = "file";
    return form.querySelector('.field[data-field="' + key + '"]');
  }

  // Errors arrive as {"error": {"code", "message", "fields": {name: [messages]}}}.
  function showErrors(message, fields, code) {
    var unplaced = [];
    var placed = 0;
    var placedTexts = [];
    Object.keys(fields || {}).forEach(function (name) {
      var messages = [].concat(fields[name]).map(String);
      var field = fieldFor(name);
      var slot = field && field.querySelector(".field-error");
      if (!slot) { unplaced.push(name + ": " + messages.join(" ")); return; }
      placed += 1;
      placedTexts = placedTexts.concat(messages);
      field.classList.add("has-error");
      slot.textContent = messages.join(" ");
      slot.hidden = false;
      if (field.closest("details")) field.closest("details").open = true;
    });
    // A plain validation message only repeats what is now shown beside its field; say where
    // to look instead. A message that says more (e.g. "send files or a source_uri, not both") stays.
    var repeats = placedTexts.some(function (text) { return message && message.indexOf(text) !== -1; });
    if (code === "invalid" && placed && !unplaced.length && repeats) {
      message = placed === 1 ? "Fix the highlighted field and upload again." : "Fix the " + placed + " highlighted fields and upload again.";
    }
    topError.textContent = message || "The upload was refused.";
    if (unplaced.length) {
      var list = document.createElement("ul");
      unplaced.forEach(function (text) {
        var item = document.createElement("li");
        item.textContent = text;
        list.appendChild(item);
      });
      topError.appendChild(list);
    }
    topError.hidden = false;
    var first = form.querySelector(".has-error input, .has-error select, .has-error textarea");
    (first || topError).scrollIntoView({ block: "center", behavior: "smooth" });
  }

  function setBusy(busy) {
    submit.disabled = busy;
    cancel.hidden = !busy;
    form.querySelectorAll("input, select, textarea").forEach(function (el) {
      if (el.type !== "hidden") el.disabled = busy;
    });
  }

  function setProgress(fraction, text) {
    var pct = Math.max(0, Math.min(100, Math.round(fraction * 100)));
    progressBox.hidden = false;
    progressBar.style.width = pct + "%";
    progressBox.querySelector(".progress").setAttribute("aria-valuenow", String(pct));
    progressText.textContent = text;
  }

  function buildBody() {
    var body = new FormData();
    FIELDS.forEach(function (name) {
      var el = form.elements[name];
      if (el && el.value !== "") body.append(name, el.value);
    });
    var current = mode();
    var total = 0;
    if (current === "files") {
      var files = Array.prototype.slice.call(filesInput.files || []);
      if (!files.length) return { error: ["file", "Choose at least one file."] };
      files.forEach(function (file) { body.append("file", file, file.name); total += file.size; });
    } else if (current === "folder") {
      var entries = folderEntries().kept;
      if (!entries.length) return { error: ["paths", "Choose a folder that contains files."] };
      // One `paths` value per file, in the same order as the file parts.
      entries.forEach(function (entry) {
        body.append("file", entry.file, entry.file.name);
        body.append("paths", entry.path);
        total += entry.file.size;
      });
    } else {
      var uri = form.elements.source_uri.value.trim();
      if (!uri) return { error: ["source_uri", "Give an s3:// or file:/// URI."] };
      body.append("source_uri", uri);
    }
    if (maxBytes && total > maxBytes) {
      return { error: [current === "folder" ? "paths" : "file",
        "These files add up to " + humanBytes(total) + "; the limit is " + maxHuman + " (STUDIO_MAX_UPLOAD_BYTES)."] };
    }
    return { body: body, total: total };
  }

  function parseError(xhr) {
    var payload = null;
    try { payload = JSON.parse(xhr.responseText); } catch (e) { payload = null; }
    var error = payload && payload.error;
    if (xhr.status === 413) {
      return { message: (error && error.message) || "The upload is larger than the limit of " + maxHuman + ".", fields: error ? error.fields : {} };
    }
    if (error) return { message: error.message, fields: error.fields || {}, code: error.code };
    if (xhr.status === 403) return { message: "You are signed out or your role does not allow uploads. Reload the page and sign in again.", fields: {} };
    return { message: "The server answered " + xhr.status + " " + xhr.statusText + ". Try again; if it persists, the server log says why.", fields: {} };
  }

  function send(event) {
    event.preventDefault();
    clearErrors();
    var built = buildBody();
    if (built.error) { showErrors("Check the highlighted field.", (function () { var f = {}; f[built.error[0]] = [built.error[1]]; return f; })()); return; }

    var xhr = new XMLHttpRequest();
    currentRequest = xhr;
    xhr.open("POST", form.getAttribute("action"));
    xhr.setRequestHeader("X-CSRFToken", form.elements.csrfmiddlewaretoken.value);
    xhr.setRequestHeader("Accept", "application/json");
    var started = Date.now();
    xhr.upload.onprogress = function (e) {
      if (!e.lengthComputable) { setProgress(0, "Uploading…"); return; }
      var seconds = (Date.now() - started) / 1000;
      var rate = seconds > 0.5 ? " · " + humanBytes(e.loaded / seconds) + "/s" : "";
      setProgress(e.loaded / e.total, "Uploading " + humanBytes(e.loaded) + " of " + humanBytes(e.total) + rate);
    };
    xhr.upload.onload = function () { setProgress(1, "Upload complete; registering the version…"); };
    xhr.onload = function () {
      currentRequest = null;
      if (xhr.status === 200 || xhr.status === 201) {
        var version = JSON.parse(xhr.responseText);
        var versionUrl = form.getAttribute("data-version-url-base") + version.id + "/";
        if (version.unchanged) {
          // Nothing was made: say so and why, and stay, so an option can be changed.
          setBusy(false);
          progressBox.hidden = true;
          var note = document.getElementById("form-unchanged");
          note.textContent = (version.reason || "Nothing changed: the files and the options are those of this version.") + " ";
          var open = document.createElement("a");
          open.href = versionUrl;
          open.textContent = "Open " + version.name + " v" + version.version;
          note.appendChild(open);
          note.hidden = false;
          return;
        }
        setProgress(1, "Opening version " + version.version + "…");
        window.location.assign(versionUrl);
        return;
      }
      setBusy(false);
      progressBox.hidden = true;
      var parsed = parseError(xhr);
      showErrors(parsed.message, parsed.fields, parsed.code);
    };
    xhr.onerror = function () {
      currentRequest = null;
      setBusy(false);
      progressBox.hidden = true;
      showErrors("The connection broke off before the upload finished. Check the network and try again.", {});
    };
    xhr.onabort = function () {
      currentRequest = null;
      setBusy(false);
      progressBox.hidden = true;
      showErrors("Upload cancelled; nothing was saved.", {});
    };
    setBusy(true);
    setProgress(0, built.total ? "Starting upload of " + humanBytes(built.total) + "…" : "Checking the source…");
    xhr.send(built.body);
  }

  form.addEventListener("submit", send);
  cancel.addEventListener("click", function () { if (currentRequest) currentRequest.abort(); });
  form.querySelectorAll('input[name="source_mode"]').forEach(function (radio) {
    radio.addEventListener("change", function () { clearErrors(); showMode(); });
  });
  filesInput.addEventListener("change", function () {
    summarise(Array.prototype.slice.call(filesInput.files || []), 0, document.getElementById("files-summary"));
  });
  folderInput.addEventListener("change", function () {
    var entries = folderEntries();
    summarise(entries.kept.map(function (e) { return e.file; }), entries.skipped, document.getElementById("folder-summary"));
  });
  // Drag-and-drop onto a drop zone highlights it; the browser drops onto the file input.
  form.querySelectorAll(".dropzone").forEach(function (zone) {
    ["dragenter", "dragover"].forEach(function (t) { zone.addEventListener(t, function () { zone.classList.add("is-dragging"); }); });
    ["dragleave", "drop"].forEach(function (t) { zone.addEventListener(t, function () { zone.classList.remove("is-dragging"); }); });
  });
  // Suggest a dataset name from the first file ("iris.csv" → "iris") if none is typed yet.
  function suggestName(fileName) {
    var nameInput = form.elements.name;
    if (nameInput.value || !fileName) return;
    nameInput.value = fileName.replace(/\.[^.]+$/, "").replace(/^(train|validation|val|test)$/i, "").slice(0, 200);
  }
  filesInput.addEventListener("change", function () { if (filesInput.files.length) suggestName(filesInput.files[0].name); });
  folderInput.addEventListener("change", function () {
    var first = folderInput.files[0];
    if (first && first.webkitRelativePath) suggestName(first.webkitRelativePath.split("/")[0]);
  });
  showMode();
})();
