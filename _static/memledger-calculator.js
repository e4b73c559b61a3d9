/* memledger's static calculator (see memledger/views/webcalc.py and memledger/views/webpeak.py).
 *
 * Python prints the data into the page: the controls, each preset's symbol values, and the
 * ledger's rows part by part with their formulas (SymPy's JavaScript printer, over BigInt).
 * This script only reads inputs with the CLI's rules (memledger.units.parse_count: the same
 * limit, the same message), looks the rows up, evaluates them exactly and renders. It decides
 * nothing about which rows exist. The verdict judges the step's peak as `memledger ledger` does:
 * each step structure comes as a record (every tensor's size as BigInt JavaScript, the GPU count
 * changes op by op), from the site's memledger-steps/ folder or, for a structure the site does
 * not carry, from the library itself running in Pyodide; the running totals are the peak and the
 * timeline drawn. It is loaded only on pages that hold a calculator (_ext/memledger_site.py), and
 * under Node it exports its functions for tests/views/test_webcalc.py.
 */
(function () {
  "use strict";

  /* Exact integer helpers that the printed formulas call (memledger.webcalc.BigIntPrinter). */
  var ml = {
    ceilDiv: function (a, b) {
      var q = a / b;
      return a % b !== 0n && (a > 0n) === (b > 0n) ? q + 1n : q;
    },
    floorDiv: function (a, b) {
      var q = a / b;
      return a % b !== 0n && (a > 0n) !== (b > 0n) ? q - 1n : q;
    },
    exactDiv: function (a, b) {
      if (a % b !== 0n) throw new Error("expected a whole number of bytes, got " + a + "/" + b);
      return a / b;
    },
    max: function () {
      return Array.prototype.reduce.call(arguments, function (x, y) { return y > x ? y : x; });
    },
    min: function () {
      return Array.prototype.reduce.call(arguments, function (x, y) { return y < x ? y : x; });
    }
  };

  function compiled(data) {
    if (!data.compiled) {
      data.compiled = data.rows.map(function (row) { return new Function("ml", "v", "return " + row[3] + ";"); });
    }
    return data.compiled;
  }

  /* Python's repr() of a string: the quotes and escapes of the CLI's messages. */
  var UNPRINTABLE = /[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]/u;

  function pyRepr(text) {
    var quote = text.indexOf("'") >= 0 && text.indexOf('"') < 0 ? '"' : "'", out = quote;
    for (var ch of text) {
      var code = ch.codePointAt(0);
      if (ch === quote || ch === "\\") out += "\\" + ch;
      else if (ch === "\t") out += "\\t";
      else if (ch === "\n") out += "\\n";
      else if (ch === "\r") out += "\\r";
      else if (code < 0x20 || code === 0x7f) out += "\\x" + code.toString(16).padStart(2, "0");
      else if (code < 0x7f || !UNPRINTABLE.test(ch)) out += ch;
      else if (code <= 0xff) out += "\\x" + code.toString(16).padStart(2, "0");
      else if (code <= 0xffff) out += "\\u" + code.toString(16).padStart(4, "0");
      else out += "\\U" + code.toString(16).padStart(8, "0");
    }
    return out + quote;
  }

  /* str.format for the templates Python sends: {name} and {name!r}. */
  function fill(template, values) {
    return template.replace(/\{(\w+)(!r)?\}/g, function (whole, name, repr) {
      if (!(name in values)) return whole;
      return repr ? pyRepr(String(values[name])) : String(values[name]);
    });
  }

  /* A positive integer from text, as memledger.units.parse_count reads it ("7", "7e9", "2.0"),
   * up to data.limit; otherwise an Error with parse_count's message naming the field. */
  var NUMBER = /^([+-]?)(?:([0-9]+)\.?([0-9]*)|\.([0-9]+))(?:[eE]([+-]?[0-9]+))?$/;
  /* Python's str.strip(): the characters str.isspace() accepts (not quite JavaScript's trim()). */
  var SPACE = "[\\t\\n\\x0b\\x0c\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]";
  var STRIP = new RegExp("^" + SPACE + "+|" + SPACE + "+$", "g");

  function parseCount(text, field, data) {
    var raw = String(text).replace(STRIP, ""), limit = BigInt(data.limit);
    var refused = new Error(fill(data.count_error, {name: field, raw: raw}));
    var m = NUMBER.exec(raw);
    if (!m) throw refused;
    var fraction = m[2] !== undefined ? m[3] : m[4];
    var digits = ((m[2] || "") + fraction).replace(/^0+/, "");
    var scale = (m[5] ? parseInt(m[5], 10) : 0) - fraction.length;
    if (!digits || m[1] === "-") throw refused;                       // zero or negative
    var zeros = digits.length - digits.replace(/0+$/, "").length;
    digits = digits.slice(0, digits.length - zeros);
    scale += zeros;
    if (scale < 0) throw refused;                                      // not a whole number
    if (digits.length + scale > data.limit.length) throw refused;     // beyond the limit, without computing it
    var value = BigInt(digits) * 10n ** BigInt(scale);
    if (value > limit) throw refused;
    return value;
  }

  /* The ledger of one setup ({field: text}): rows with exact BigInt bytes, and totals per device. */
  function ledger(data, setup) {
    var formulas = compiled(data), v = bindings(data, setup), rows = [], totals = {};
    data.parts.forEach(function (part) {
      var key = part.fields.map(function (f) { return setup[f]; }).join("|");
      if (!(key in part.rows)) throw new Error("no rows for " + part.fields.join(", ") + " = " + key);
      part.rows[key].forEach(function (i) {
        var row = data.rows[i];
        rows.push({name: row[0], group: row[1], device: row[2], bytes: formulas[i](ml, v)});
      });
    });
    data.devices.forEach(function (d) { totals[d[0]] = 0n; });
    rows.forEach(function (r) { totals[r.device] += r.bytes; });
    return {rows: rows, totals: totals};
  }

  /* The symbol values of one setup: the preset's, then those the controls set. */
  function bindings(data, setup) {
    var v = {}, preset = data.bindings[setup[data.bindings_field]];
    if (!preset) throw new Error("unknown " + data.bindings_field + " " + setup[data.bindings_field]);
    Object.keys(preset).forEach(function (name) { v[name] = BigInt(preset[name]); });
    data.symbols.forEach(function (s) { if (s[1] in setup) v[s[0]] = BigInt(setup[s[1]]); });
    return v;
  }

  /* --- the step's peak (memledger/views/webpeak.py) --------------------------------------------- */

  /* The page's name of the step structure of a setup (webpeak.structure_key). */
  function structureKey(data, setup) {
    return data.step.fields.map(function (f) { return setup[f]; }).join("|") + "|" +
      (BigInt(setup.batch_size) === 1n ? "B=1" : "B>1");
  }

  /* Where the record of a setup's structure is: {unmodelled: the verdict's note}, {name} (a file of the site),
   * or {key} (a structure the site does not carry: the library builds it in the browser). */
  function recordSource(data, setup) {
    var reason = data.step.unmodelled[setup.arch][setup.flash_attention][setup.recipe];
    if (reason) return {unmodelled: reason};
    var key = structureKey(data, setup), entry = data.step.index[key];
    if (entry === undefined) return {key: key};
    return typeof entry === "string" ? {name: entry} : entry;
  }

  /* The step of one setup from its record: the GPU total after every op (BigInt), the peak, its op. */
  function evaluateStep(record, data, setup) {
    if (!record.size) record.size = new Function("ml", "v", "return [" + record.sizes.join(", ") + "];");
    var v = bindings(data, setup);
    v.P = BigInt(data.step.params[setup.arch]);      // the step counts the tensors (step_values)
    var sizes = record.size(ml, v), total = 0n, totals = [], best = -1n, sample = 0;
    record.deltas.forEach(function (changes, k) {
      changes.forEach(function (c) { total += BigInt(c[1]) * sizes[c[0]]; });
      totals.push(total);
      if (total > best) { best = total; sample = k; }
    });
    var moment = record.moments[sample], layer = moment[1];
    var block = layer === null ? null : (record.lumped && layer >= 3 ? Number(v.L) - 5 + layer : layer);
    return {totals: totals, peak: best, sample: sample, phase: moment[0], block: block,
            phases: record.moments.map(function (m) { return m[0]; })};
  }

  /* What the verdict compares with the GPU, as memledger.answers.verdict.judge: {bytes, key, clause}. */
  function judge(data, setup, totals, step) {
    var total = totals[data.verdict_device];
    if (!step) return {bytes: total, key: "total", clause: "total"};
    if (data.step.nominal[setup.arch] && total > step.peak) return {bytes: total, key: "nominal", clause: "nominal"};
    return {bytes: step.peak, key: data.step.nominal[setup.arch] ? "nominal" : "peak", clause: "peak"};
  }

  /* The verdict's clause (memledger.answers.verdict.describe). */
  function clause(data, judged, totals, step, reason) {
    return fill(data.step.clauses[judged.clause], {
      total_measure: data.step.measures.total, peak_measure: data.step.measures.peak,
      total: size(totals[data.verdict_device], data), peak: step ? size(step.peak, data) : "",
      note: reason || data.step.notes.sum});
  }

  /* The verdict sentence (memledger.answers.verdict.sentence, standing and assess): {standing, assessment, text}. */
  function sentence(data, judged, gpu, clauseText) {
    var room = gpu - judged, margin = BigInt(data.step.margin);
    var standing = room < 0n ? "over" : room < margin ? "tight" : "fits";
    var assessment = fill(data.step.assessments[standing], {
      over: size(-room, data), room: size(room, data), margin: size(margin, data)});
    return {standing: standing, assessment: assessment, text: fill(data.step.sentence, {
      assessment: assessment, judged: size(judged, data), gpu: size(gpu, data), clause: clauseText})};
  }

  /* shlex.quote */
  function shellQuote(text) {
    if (text === "") return "''";
    return /[^\w@%+=:,./-]/.test(text) ? "'" + text.replace(/'/g, "'\"'\"'") + "'" : text;
  }

  /* The memledger ledger command of a setup (memledger.views.controls.cli_command). */
  function cliCommand(data, setup) {
    var words = ["memledger", "ledger"];
    data.step.cli.forEach(function (c) {
      if (c[3] && setup[c[3][0]] === c[3][1]) return;          // ignored by the ledger there (IGNORED_WHEN)
      if (c[2]) { if (setup[c[0]] === "true") words.push(c[1]); }
      else words.push(c[1], setup[c[0]]);
    });
    return words.map(shellQuote).join(" ");
  }

  function bitLength(n) { return n === 0n ? 0 : n.toString(2).length; }

  function group(digits) { return digits.replace(/\B(?=(\d{3})+(?!\d))/g, ","); }

  /* f"{n:,}" */
  function formatInt(n) { return group(n.toString()); }

  /* memledger.units.format_bytes without the unit: f"{float(Fraction(n, unit)):,.{digits}f}".
   * The quotient is rounded to the nearest double (ties to even) as Python's int division does,
   * then printed from that double's exact binary value, rounding half to even as Python does. */
  function formatUnit(n, unit, digits) {
    var k = Math.max(0, 64 - (bitLength(n) - bitLength(unit)));
    var scaled = n << BigInt(k), q = scaled / unit;
    if (scaled % unit !== 0n) q |= 1n;                // sticky bit: q has >= 62 bits, so rounding sees it
    var mantissa = BigInt(Number(q));                 // the double, times 2^k, exactly
    var t = mantissa * 10n ** BigInt(digits), i = t >> BigInt(k);
    if (k > 0) {
      var rest = t - (i << BigInt(k)), half = 1n << BigInt(k - 1);
      if (rest > half || (rest === half && (i & 1n))) i += 1n;
    }
    var s = i.toString().padStart(digits + 1, "0");
    return digits ? group(s.slice(0, s.length - digits)) + "." + s.slice(s.length - digits) : group(s);
  }

  function size(n, data) { return formatUnit(n, BigInt(data.unit[1]), data.digits) + " " + data.unit[0]; }

  function element(tag, text, className) {
    var e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (className) e.className = className;
    return e;
  }

  /* The setup the form describes: {setup, errors}; each refused field is marked aria-invalid. */
  function read(form, data) {
    var setup = {}, errors = [];
    data.controls.forEach(function (c) {
      var input = form.elements[c.field], value = input.value;
      try {
        if (c.count) {
          value = parseCount(value, c.field, data).toString();
        } else if (!c.options.some(function (o) { return o[0] === value; })) {
          throw new Error(c.field + " must be one of " + c.options.map(function (o) { return o[0]; }).join(", ") +
                          ", got " + pyRepr(value));
        }
        setup[c.field] = value;
        input.removeAttribute("aria-invalid");
      } catch (error) {
        errors.push(error.message);
        input.setAttribute("aria-invalid", "true");
      }
    });
    return {setup: setup, errors: errors};
  }

  var SVG = "http://www.w3.org/2000/svg";

  function svg(tag, attributes, text) {
    var e = document.createElementNS(SVG, tag);
    Object.keys(attributes).forEach(function (k) { e.setAttribute(k, attributes[k]); });
    if (text !== undefined) e.textContent = text;
    return e;
  }

  var PHASE_COLOURS = {forward: "#eef3fa", loss: "#fbf1e6", backward: "#f6eef6", optimizer: "#eef6ee"};

  /* A fraction in [0, 1] of two BigInts, as a Number. */
  function ratio(a, b) { return b === 0n ? 0 : Number(a * 1000000n / b) / 1e6; }

  /* The GPU total after every op of the step: phases shaded, the GPU's memory dashed, the peak marked. */
  function timeline(step, gpu, data) {
    var width = 640, height = 190, left = 64, right = 10, top = 22, bottom = 18;
    var plotW = width - left - right, plotH = height - top - bottom, n = step.totals.length;
    var most = step.peak > gpu ? step.peak : gpu;
    function x(k) { return left + plotW * (k + 0.5) / n; }
    function y(b) { return top + plotH * (1 - ratio(b, most)); }
    var root = svg("svg", {viewBox: "0 0 " + width + " " + height, width: width, role: "img",
                           style: "max-width: 100%; height: auto", "font-size": 11, "font-family": "sans-serif",
                           "class": "memledger-calculator-timeline",
                           "aria-label": "GPU memory through one training step; peak " + size(step.peak, data)});
    var start = 0;
    step.phases.forEach(function (phase, k) {
      if (k + 1 < n && step.phases[k + 1] === phase) return;
      var x0 = left + plotW * start / n, x1 = left + plotW * (k + 1) / n;
      root.appendChild(svg("rect", {x: x0, y: top, width: x1 - x0, height: plotH, "class": "phase " + phase,
                                    fill: PHASE_COLOURS[phase] || "#f2f2f2"}));
      root.appendChild(svg("text", {x: (x0 + x1) / 2, y: top + plotH + 13, "text-anchor": "middle"}, phase));
      start = k + 1;
    });
    root.appendChild(svg("line", {x1: left, x2: left + plotW, y1: y(gpu), y2: y(gpu), "class": "gpu",
                                  stroke: "crimson", "stroke-width": 1.5, "stroke-dasharray": "6 4"}));
    root.appendChild(svg("text", {x: left - 4, y: y(gpu) + 4, "text-anchor": "end"}, size(gpu, data)));
    root.appendChild(svg("text", {x: left - 4, y: top + plotH, "text-anchor": "end"}, "0"));
    root.appendChild(svg("polyline", {"class": "total", fill: "none", stroke: "#4C72B0", "stroke-width": 1.5,
                                      points: step.totals.map(function (b, k) {
      return x(k).toFixed(1) + "," + y(b).toFixed(1); }).join(" ")}));
    var px = x(step.sample), py = y(step.peak);
    root.appendChild(svg("circle", {cx: px, cy: py, r: 4, "class": "peak", fill: "black"}));
    root.appendChild(svg("text", {x: px, y: Math.max(py - 7, 10), "class": "peak",
                                  "text-anchor": px > left + plotW * 0.7 ? "end" : "middle"},
                         "peak " + size(step.peak, data)));
    return root;
  }

  function where(step) {
    return step.phase + (step.block === null ? ", outside the blocks" : ", block " + step.block);
  }

  /* The output for one setup: the verdict (by the step's peak where modelled; `step` undefined while its
   * record loads), the timeline, the command that reproduces it, and the ledger's rows. */
  function view(data, setup, result, step, reason) {
    var out = document.createDocumentFragment();
    var gpu = BigInt(data.gpus[setup[data.gpu_field]]);
    var verdict = element("p", undefined, "memledger-calculator-verdict");
    if (step === undefined && !reason) {
      verdict.appendChild(element("i", "judging " + data.step.measures.peak + " ..."));
    } else {
      var judged = judge(data, setup, result.totals, step), said = sentence(data, judged.bytes, gpu,
                                                                           clause(data, judged, result.totals, step, reason));
      verdict.setAttribute("data-measure", judged.key);
      verdict.setAttribute("data-judged-bytes", judged.bytes.toString());
      verdict.appendChild(element("b", said.assessment, said.standing === "fits" ? "fits" : "does-not-fit"));
      verdict.appendChild(document.createTextNode(said.text.slice(said.assessment.length)));
    }
    out.appendChild(verdict);
    if (step) {
      out.appendChild(timeline(step, gpu, data));
      out.appendChild(element("p", "GPU memory after each of the step's " + step.totals.length + " modelled ops; " +
                              "the peak comes in " + where(step) + "; dashed: the GPU's memory.",
                              "memledger-calculator-caption"));
    }
    var command = cliCommand(data, setup), cli = element("p", undefined, "memledger-calculator-command");
    var code = element("code", command);
    code.setAttribute("data-cli", command);
    cli.appendChild(document.createTextNode("The same from the command line: "));
    cli.appendChild(code);
    out.appendChild(cli);
    var table = element("table", undefined, "memledger"), head = table.createTHead().insertRow();
    var body = table.createTBody(), labels = {};
    data.devices.forEach(function (d) { labels[d[0]] = d[1]; });
    data.header.forEach(function (h) { head.appendChild(element("th", h)); });
    function line(cells, tag, className) {
      var tr = body.insertRow();
      if (className) tr.className = className;
      cells.forEach(function (c, i) { tr.appendChild(element(tag, c, i > 2 ? "number" : undefined)); });
    }
    result.rows.forEach(function (r) {
      line([r.name, r.group, labels[r.device], formatInt(r.bytes), size(r.bytes, data)], "td");
    });
    data.devices.forEach(function (d) {
      var n = result.totals[d[0]];
      if (n !== 0n || d[0] === data.verdict_device) line(["total on " + d[1], "", d[1], formatInt(n), size(n, data)], "th", "total");
    });
    out.appendChild(table);
    return out;
  }

  /* The script's own folder: records lie next to it (memledger.views.webpeak.FOLDER). */
  var HERE = typeof document === "object" && document.currentScript ?
    document.currentScript.src.replace(/[^/]*$/, "") : "";

  /* The library in the browser, loaded once on first need (Pyodide, from the site's vendor/ folder). */
  var python = null;

  function loadPython(data) {
    if (!python) {
      python = new Promise(function (resolve, reject) {
        var tag = document.createElement("script");
        tag.src = HERE + data.step.pyodide.script;
        tag.onload = function () { resolve(); };
        tag.onerror = function () { reject(new Error("cannot load Pyodide from " + tag.src)); };
        document.head.appendChild(tag);
      }).then(function () {
        return window.loadPyodide({indexURL: HERE + data.step.pyodide.index, stdout: function () {}});
      }).then(function (py) {
        return Promise.all(data.step.pyodide.archives.map(function (name) {
          return fetch(HERE + name).then(function (r) {
            if (!r.ok) throw new Error("cannot load " + name + ": HTTP " + r.status);
            return r.arrayBuffer();
          }).then(function (buffer) { py.unpackArchive(buffer, "zip", {extractDir: "/home/pyodide/lib"}); });
        })).then(function () {
          py.runPython(data.step.pyodide.start);
          return py;
        });
      });
    }
    return python;
  }

  var records = {};

  /* The record of a structure: a file of the site, or built by the library in the browser. */
  function loadRecord(data, source, setup) {
    var id = source.name || source.key;
    if (!records[id]) {
      records[id] = source.name ?
        fetch(HERE + data.step.folder + "/" + source.name + ".json").then(function (r) {
          if (!r.ok) throw new Error("cannot load the step record " + source.name + ": HTTP " + r.status);
          return r.json();
        }) :
        loadPython(data).then(function (py) {
          return JSON.parse(py.globals.get("browser_record")(JSON.stringify(setup)));
        });
      records[id].catch(function () { delete records[id]; });
    }
    return records[id];
  }

  function start(root) {
    var data = JSON.parse(root.querySelector("script.memledger-calculator-data").textContent);
    var form = root.querySelector("form"), out = root.querySelector(".memledger-calculator-out"), latest = 0;
    function failed(message) {
      return element("p", String(message), "memledger-calculator-error");
    }
    function update() {
      var content, state = read(form, data), token = ++latest;
      if (state.errors.length) {
        content = document.createDocumentFragment();
        state.errors.forEach(function (message) {
          var p = element("p", message, "memledger-calculator-error");
          p.setAttribute("role", "alert");
          content.appendChild(p);
        });
        out.replaceChildren(content);
        return;
      }
      var setup = state.setup, result, source;
      try {
        result = ledger(data, setup);
        source = recordSource(data, setup);
      } catch (error) {
        out.replaceChildren(failed(error.message));
        return;
      }
      if (source.unmodelled) {
        out.replaceChildren(view(data, setup, result, null, source.unmodelled));   // all at once: never half a table
        return;
      }
      out.replaceChildren(view(data, setup, result, undefined));
      if (source.key && !python) {
        out.querySelector(".memledger-calculator-verdict").appendChild(document.createTextNode(" " + data.step.pyodide.note));
      }
      loadRecord(data, source, setup).then(function (record) {
        if (token !== latest) return;
        if (record.unmodelled) out.replaceChildren(view(data, setup, result, null, record.unmodelled));
        else out.replaceChildren(view(data, setup, result, evaluateStep(record, data, setup)));
      }).catch(function (error) {
        if (token === latest) out.replaceChildren(failed(error.message));
      });
    }
    form.addEventListener("submit", function (e) { e.preventDefault(); });
    form.addEventListener("input", update);
    form.addEventListener("change", update);
    update();
  }

  if (typeof module === "object" && module.exports) {
    module.exports = {ml: ml, ledger: ledger, parseCount: parseCount, formatInt: formatInt, formatUnit: formatUnit,
                      pyRepr: pyRepr, structureKey: structureKey, recordSource: recordSource,
                      evaluateStep: evaluateStep, judge: judge, cliCommand: cliCommand, clause: clause,
                      sentence: sentence};
  } else {
    var begin = function () {
      Array.prototype.forEach.call(document.querySelectorAll(".memledger-calculator"), start);
    };
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", begin);
    else begin();
  }
})();
