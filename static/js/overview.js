/* Overview: tiles, the activity chart, the live feed and the periodic duties, refreshed after every notice. */
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
  });

  drawChart(JSON.parse(document.getElementById("chart-data").textContent));
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
