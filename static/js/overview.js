/* Overview: tiles, the activity chart, the live feed, today's spend (cost and tokens by model or
   paid tool, and by agent) and the periodic duties, refreshed after every notice. */
(function () {
  "use strict";
  const page = document.getElementById("overview-page");
  let lastPosition = Number(page.dataset.lastPosition || 0);
  let hours = 1;
  const chartEl = document.getElementById("activity-chart");
  const COLOURS = { events: "#9aa9c7", completions: "#2ca02c", stalls: "#d62728", recoveries: "#17becf" };

  function drawChart(chart) {
    const x = chart.minutes.map(BP.plotlyLocal);
    const traces = Object.keys(chart.series).map((name) => ({
      type: name === "events" ? "bar" : "scatter",
      mode: name === "events" ? undefined : "lines+markers",
      name, x, y: chart.series[name],
      yaxis: name === "events" ? "y" : "y2",
      marker: { color: COLOURS[name], size: 4 },
      line: { width: 2 },
      hovertemplate: `%{y} ${name}<extra>%{x}</extra>`,
    }));
    Plotly.react(chartEl, traces, {
      margin: { l: 48, r: 48, t: 8, b: 36 },
      bargap: 0.1,
      legend: { orientation: "h", y: 1.1 },
      xaxis: { type: "date", title: { text: `per ${chart.step_minutes} min, your time` } },
      yaxis: BP.countAxis(chart.series.events, { title: { text: "events" } }),
      yaxis2: BP.countAxis([...chart.series.completions, ...chart.series.stalls, ...chart.series.recoveries],
                           { title: { text: "completions · stalls · recoveries" }, overlaying: "y", side: "right",
                             showgrid: false }),
    }, { displaylogo: false, responsive: true });
  }

  // --- spend today -------------------------------------------------------------------------------
  const PART_COLOURS = { "uncached input": "#9aa9c7", "cache read": "#c9d3ea", "cache write": "#6f84b3",
                         output: "#2f5bd3", reasoning: "#7048c6" };
  const CURRENCY_COLOURS = ["#1f8a4c", "#b7791f", "#17becf", "#9467bd"];
  let spend = JSON.parse(document.getElementById("spend-data").textContent);
  let measure = "cost";

  /* One group's bars: cost per currency, or tokens stacked by part (the parts no call had are
     left out). Calls with no price are said so beside their row's cost, and a row with nothing
     priced gets a marked point at zero instead of a zero-length bar that would read as free. */
  const UNPRICED_COLOUR = "#9a5b00";
  function spendTraces(group) {
    const y = group.labels;
    const common = { type: "bar", orientation: "h", y, customdata: group.summary,
                     hovertemplate: "%{y}<br>%{customdata}<extra>%{fullData.name}</extra>" };
    if (measure === "tokens") {
      return Object.keys(group.tokens).filter((part) => group.tokens[part].some((n) => n > 0))
        .map((part) => Object.assign({}, common, { name: part, x: group.tokens[part],
                                                   marker: { color: PART_COLOURS[part] } }));
    }
    const currencies = spend.currencies;
    // The last currency a row has a cost in carries the row's words for its calls with no price.
    const last = y.map((_, i) => currencies.filter((c) => group.cost[c].text[i]).pop());
    const traces = currencies.map((currency, n) => Object.assign({}, common, {
      name: currency, x: group.cost[currency].amounts.map(Number),
      text: group.cost[currency].text.map((text, i) => (last[i] === currency && group.unpriced_text[i]
        ? `${text} <span style="color:${UNPRICED_COLOUR}">+ ${group.unpriced_text[i]}</span>` : text)),
      textposition: "outside", cliponaxis: false, marker: { color: CURRENCY_COLOURS[n % CURRENCY_COLOURS.length] },
    }));
    const unpriced = group.unpriced_calls.map((n, i) => (n && !last[i] ? i : -1)).filter((i) => i >= 0);
    if (unpriced.length) {
      traces.push({
        type: "scatter", mode: "markers+text", name: "no price", y: unpriced.map((i) => y[i]),
        x: unpriced.map(() => 0), text: unpriced.map((i) => group.unpriced_text[i]), textposition: "middle right",
        customdata: unpriced.map((i) => group.summary[i]), cliponaxis: false,
        marker: { symbol: "x-thin-open", size: 10, color: UNPRICED_COLOUR, line: { width: 2 } },
        textfont: { color: UNPRICED_COLOUR }, hovertemplate: "%{y}<br>%{customdata}<extra>no price</extra>",
      });
    }
    return traces;
  }

  function drawSpendChart(el, group) {
    const tokens = measure === "tokens";
    const axis = { rangemode: "tozero", automargin: true };
    // Nothing priced: no bars, only the calls with no price at zero, on an axis that starts there.
    if (!tokens && !spend.currencies.length) Object.assign(axis, { range: [0, 1], showticklabels: false });
    Plotly.react(el, spendTraces(group), {
      barmode: tokens ? "stack" : "group",
      height: 80 + 30 * Math.max(1, group.labels.length),
      // Five parts of tokens may take two lines of legend.
      margin: { l: 10, r: tokens ? 20 : 210, t: tokens ? 52 : 28, b: 28 },
      xaxis: axis,
      yaxis: { type: "category", autorange: "reversed", automargin: true },
      // In the top margin, from the chart's left edge (not the plot's, which the labels push right).
      legend: { orientation: "h", xref: "container", yref: "container", x: 0, y: 1, yanchor: "top",
                traceorder: "normal", font: { size: 11 } },
      showlegend: true,
    }, { displaylogo: false, responsive: true });
  }

  function drawSpend(data) {
    spend = data;
    const empty = !data.total.calls && !Object.keys(data.total.cost).length;
    document.getElementById("spend-empty").hidden = !empty;
    document.querySelector("#spend-panel .spend-charts").hidden = empty;
    const since = document.getElementById("spend-since");
    since.setAttribute("datetime", data.since);
    BP.renderTimes(since.parentElement);
    if (empty) return;
    drawSpendChart(document.getElementById("spend-by-model"), data.by_model);
    drawSpendChart(document.getElementById("spend-by-agent"), data.by_agent);
  }

  const refresh = BP.serial(async () => {
    const data = await BP.getJSON(`/live/overview/?after_position=${lastPosition}&hours=${hours}`);
    const tiles = document.getElementById("tiles");
    const before = {};
    tiles.querySelectorAll(".tile").forEach((t) => { before[t.dataset.tile] = t.querySelector(".tile-value").textContent; });
    tiles.innerHTML = data.tiles;
    tiles.querySelectorAll(".tile").forEach((t) => {
      if (before[t.dataset.tile] !== undefined && before[t.dataset.tile] !== t.querySelector(".tile-value").textContent) {
        t.classList.add("changed");
      }
    });
    BP.renderTimes(tiles);
    // Pinned saved searches (their live counts) and the alerts panel.
    const saved = document.getElementById("saved-tiles");
    saved.innerHTML = data.saved_tiles;
    saved.hidden = !saved.querySelector(".tile");
    const alerts = document.getElementById("alerts-body");
    alerts.innerHTML = data.alerts;
    BP.renderTimes(alerts);
    const pauses = document.getElementById("pauses-live");
    pauses.innerHTML = data.pauses;
    BP.renderTimes(pauses);
    const duties = document.getElementById("duties-body");
    duties.innerHTML = data.duties;
    BP.renderTimes(duties);
    const body = document.querySelector("#live-feed tbody");
    const fresh = BP.fragment(data.feed, true);
    const rows = Array.from(fresh.querySelectorAll("tr[data-position]"))
      .filter((tr) => Number(tr.dataset.position) > lastPosition &&
                      !body.querySelector(`tr[data-position="${tr.dataset.position}"]`));
    rows.reverse().forEach((tr) => { tr.classList.add("fresh"); body.prepend(tr); BP.renderTimes(tr); });
    while (body.children.length > 60) body.lastElementChild.remove();
    if (rows.length) document.getElementById("feed-empty")?.remove();
    lastPosition = Math.max(lastPosition, Number(data.last_position || 0));
    drawChart(data.chart);
    document.getElementById("spend-figures").innerHTML = data.spend;
    drawSpend(data.spend_chart);
  });

  drawChart(JSON.parse(document.getElementById("chart-data").textContent));
  drawSpend(spend);
  document.querySelectorAll("#spend-measure button").forEach((button) => {
    button.addEventListener("click", () => {
      measure = button.dataset.measure;
      document.querySelectorAll("#spend-measure button").forEach((b) => b.classList.toggle("on", b === button));
      drawSpend(spend);
    });
  });
  document.querySelectorAll("#chart-range button").forEach((button) => {
    button.addEventListener("click", () => {
      hours = Number(button.dataset.hours);
      document.querySelectorAll("#chart-range button").forEach((b) => b.classList.toggle("on", b === button));
      refresh();
    });
  });
  BP.connect("/ws/fleet/", { onNotice: () => refresh(), catchUp: () => refresh() });
  // Ages and per-minute windows move on with no event at all: refresh twice a minute anyway.
  setInterval(() => refresh(), 30000);
})();
