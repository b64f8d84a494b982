(function () {
  'use strict';
  var D = JSON.parse(document.getElementById('es-data').textContent);
  function fmtNs(ns) {
    if (ns < 1e3) return (Math.round(ns * 10) / 10) + ' ns';
    if (ns < 1e6) return +(ns / 1e3).toPrecision(3) + ' us';
    if (ns < 1e9) return +(ns / 1e6).toPrecision(3) + ' ms';
    return +(ns / 1e9).toPrecision(3) + ' s';
  }
  function fmtUs(us) { return fmtNs(us * 1e3); }
  var drawn = 0;
  function mount(c, option, height) {
    var el = document.getElementById(c.id);
    if (height) el.style.height = height + 'px';
    var chart = echarts.init(el, null, {renderer: 'canvas'});
    chart.on('finished', function () {
      if (el.dataset.drawn) return;
      el.dataset.drawn = '1';
      document.body.dataset.chartsDrawn = String(++drawn);
    });
    option.animation = false;
    chart.setOption(option);
    window.addEventListener('resize', function () { chart.resize(); });
  }
  var title = function (t) { return {text: t, left: 'center', top: 4, textStyle: {fontSize: 14}}; };
  function hist(c) {
    mount(c, {
      title: title(c.title),
      tooltip: {trigger: 'axis', confine: true},
      legend: {type: 'scroll', bottom: 0},
      grid: {left: 70, right: 30, top: 40, bottom: 100},
      xAxis: {type: 'category', data: c.categories, name: 'exit duration (log scale: 4 bins per octave, bin start)',
              nameLocation: 'middle', nameGap: 58,
              axisTick: {alignWithLabel: true},
              axisLabel: {rotate: 40, interval: c.categories.length <= 28 ? 0 :
                          function (i) { return c.octave[i]; }}},
      yAxis: {type: 'log', min: 1, name: 'exits (log)', nameGap: 12},
      series: c.series.map(function (s) {
        return {name: s.name, type: 'line', data: s.data, connectNulls: false, showSymbol: true,
                symbolSize: 5, step: false};
      })
    });
  }
  function timeline(c) {
    var n = c.tracks.length, h = n > 8 ? 120 : 170, top0 = 56, grids = [], xs = [], ys = [], series = [];
    c.tracks.forEach(function (t, i) {
      grids.push({left: 100, right: 30, top: top0 + i * h, height: h - 46});
      xs.push({type: 'value', gridIndex: i, min: 0, max: c.t1, name: 'time since the first exit (s)',
               nameLocation: 'middle', nameGap: 24, nameTextStyle: {fontSize: 11},
               axisLabel: {showMaxLabel: false}});
      ys.push({type: 'log', gridIndex: i, min: c.ymin, max: c.ymax, name: t.name,
               nameLocation: 'middle', nameGap: 66, nameTextStyle: {fontWeight: 'bold', fontSize: 13},
               axisLabel: {formatter: function (v) { return fmtUs(v); }}});
      series.push({name: 'exits', type: 'scatter', xAxisIndex: i, yAxisIndex: i, data: t.normal,
                   symbolSize: 3, itemStyle: {color: '#4e79a7', opacity: 0.7}, large: true, largeThreshold: 5000});
      series.push({name: 'slow exits', type: 'scatter', xAxisIndex: i, yAxisIndex: i, data: t.slow,
                   symbol: 'triangle', symbolSize: 9, itemStyle: {color: '#d62728'}});
    });
    var all = c.tracks.map(function (_, i) { return i; });
    mount(c, {
      title: title(c.title),
      legend: {data: ['exits', 'slow exits'], top: 24},
      tooltip: {trigger: 'item', confine: true, formatter: function (p) {
        return (c.labels[p.data[2]] || '') + '<br>at ' + p.data[0].toFixed(6) + ' s, took ' + fmtUs(p.data[1]);
      }},
      grid: grids, xAxis: xs, yAxis: ys, series: series,
      dataZoom: [{type: 'inside', xAxisIndex: all}]
    }, top0 + n * h + 10);
  }
  function rate(c) {
    mount(c, {
      title: title(c.title),
      tooltip: {trigger: 'axis', confine: true},
      legend: {type: 'scroll', bottom: 0},
      grid: {left: 80, right: 30, top: 40, bottom: 70},
      xAxis: {type: 'value', name: 'time since the first exit (s)', nameLocation: 'middle', nameGap: 28},
      yAxis: {type: 'value', name: 'exits / s'},
      series: c.series.map(function (s) {
        var slow = s.name.indexOf('slow') === 0;
        return {name: s.name, type: 'line', data: s.data, showSymbol: false, step: 'middle',
                lineStyle: {width: slow ? 2 : 1.5}, itemStyle: slow ? {color: '#d62728'} : undefined};
      })
    });
  }
  function split(c) {
    var colors = {'kernel before': '#f28e2b', 'handler (VMM)': '#4e79a7', 'kernel after': '#59a14f',
                  'off-CPU': '#bab0ac'};
    mount(c, {
      title: title(c.title),
      legend: {top: 24},
      tooltip: {trigger: 'axis', axisPointer: {type: 'shadow'}, confine: true, formatter: function (ps) {
        var i = ps[0].dataIndex;
        var s = c.categories[i] + ': ' + c.counts[i] + ' exits, kernel time mean ' + fmtUs(c.mean_us[i]);
        ps.forEach(function (p) {
          var q = c.parts[p.seriesIndex];
          s += '<br>' + p.marker + q.name + ': ' + p.value.toFixed(1) + '% (mean ' + fmtUs(q.mean_us[i]) +
               ', p50 ' + fmtNs(q.p50[i]) + ', p99 ' + fmtNs(q.p99[i]) + ')';
        });
        return s;
      }},
      grid: {left: 330, right: 40, top: 56, bottom: 40},
      yAxis: {type: 'category', inverse: true,
              data: c.categories.map(function (k, i) {
                return k + '  (' + c.counts[i] + ' x ' + fmtUs(c.mean_us[i]) + ')';
              }),
              axisLabel: {width: 315, overflow: 'truncate'}},
      xAxis: {type: 'value', min: 0, max: 100, name: "share of the kernel's exit time (%)",
              nameLocation: 'middle', nameGap: 26},
      series: c.parts.map(function (p) {
        return {name: p.name, type: 'bar', stack: 'split', data: p.share, barMaxWidth: 22,
                itemStyle: {color: colors[p.name]}};
      })
    }, 110 + 26 * c.categories.length);
  }
  var kinds = {hist: hist, timeline: timeline, rate: rate, split: split};
  D.charts.forEach(function (c) { kinds[c.kind](c); });
  document.body.dataset.charts = String(D.charts.length);
})();
