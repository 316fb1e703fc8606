// Our ECharts host for Perses's charts: web/build.mjs puts it in the place of
// @perses-dev/components' EChart (same props, same exports), which every
// Perses chart (time series, stat, status history) draws through.
//
// Why: Perses's EChart calls the chart's resize() after every render whose
// `sx` or `style` is a new object, and its charts pass new ones on every
// render. ECharts redraws every series on resize() even when the size did not
// change, so each re-render of a panel redrew it whole: 136 resizes and 12,660
// line redraws in the first 7 s of the transfer overview at 128 streams
// (docs/performance.md, "The live view's first drawing"). Here a chart is resized only when its
// box's size changes (a ResizeObserver), and given a new option only when the
// option differs.
import { memo, useEffect, useLayoutEffect, useRef } from 'react';
import { Box } from '@mui/material';
import isEqual from 'lodash/isEqual';
import { connect, init, use } from 'echarts/core';
import { BarChart, CustomChart, GaugeChart, HeatmapChart, LineChart, PieChart, ScatterChart } from 'echarts/charts';
import {
  DatasetComponent,
  DataZoomComponent,
  GridComponent,
  LegendComponent,
  MarkAreaComponent,
  MarkLineComponent,
  MarkPointComponent,
  TitleComponent,
  ToolboxComponent,
  TooltipComponent,
  VisualMapComponent,
} from 'echarts/components';
import { CanvasRenderer } from 'echarts/renderers';

// The chart types and components Perses's plugins expect registered by this module.
use([BarChart, CustomChart, GaugeChart, HeatmapChart, LineChart, PieChart, ScatterChart, CanvasRenderer]);
use([DatasetComponent, DataZoomComponent, GridComponent, LegendComponent, MarkAreaComponent, MarkLineComponent]);
use([MarkPointComponent, TitleComponent, ToolboxComponent, TooltipComponent, VisualMapComponent]);

// How an event handler of `onEvents` is called, by event: pointer events get the
// event and the chart; these chart events the event alone; any other, the chart.
const POINTER_EVENTS = new Set(['click', 'dblclick', 'mousedown', 'mousemove', 'mouseup', 'mouseover', 'mouseout', 'globalout', 'contextmenu']);
const CHART_EVENTS = new Set(['datazoom', 'downplay', 'highlight']);

function listen(chart, onEvents) {
  for (const [name, handler] of Object.entries(onEvents || {})) {
    if (typeof handler !== 'function') continue;
    if (POINTER_EVENTS.has(name)) chart.on(name, (event) => handler(event, chart));
    else if (CHART_EVENTS.has(name)) chart.on(name, (event) => handler(event));
    else chart.on(name, () => handler(null, chart));
  }
}

export const EChart = memo(function EChart({ option, theme, renderer, sx, style, onEvents, _instance, syncGroup, onChartInitialized }) {
  const box = useRef(null);
  const chart = useRef(null);
  const drawn = useRef(option);

  useLayoutEffect(() => {
    if (box.current === null) return undefined;
    const instance = init(box.current, theme, { renderer: renderer ?? 'canvas' });
    chart.current = instance;
    instance.setOption(drawn.current, true);
    onChartInitialized?.(instance);
    if (_instance !== undefined) _instance.current = instance;
    // Resized when, and only when, the box's size differs from the chart's.
    const watcher = new ResizeObserver(() => {
      const element = box.current;
      if (!element || instance.isDisposed()) return;
      if (element.clientWidth !== instance.getWidth() || element.clientHeight !== instance.getHeight()) {
        instance.resize();
      }
    });
    watcher.observe(box.current);
    return () => {
      watcher.disconnect();
      instance.dispose();
      chart.current = null;
    };
  }, [_instance, onChartInitialized, theme, renderer]);

  useEffect(() => {
    if (!chart.current || !syncGroup) return;
    chart.current.group = syncGroup;
    connect([chart.current]);
  }, [syncGroup]);

  useEffect(() => {
    if (!chart.current || isEqual(drawn.current, option)) return;
    chart.current.setOption(option, true);
    drawn.current = option;
  }, [option]);

  useEffect(() => {
    const instance = chart.current;
    if (!instance || onEvents === undefined) return undefined;
    listen(instance, onEvents);
    return () => {
      if (instance.isDisposed()) return;
      for (const name of Object.keys(onEvents)) instance.off(name);
    };
  }, [onEvents]);

  return <Box ref={box} sx={sx} style={style} />;
});
