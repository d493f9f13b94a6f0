package render

import (
	"fmt"
	"math"
	"strconv"

	"github.com/ginqueue/ginqueue/bench/internal/suite"
)

// formatValue prints x in format f.
func formatValue(f suite.Format, x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "–"
	}
	switch f {
	case suite.FormatDuration:
		a := math.Abs(x)
		// Each unit up to the figure that would round to 1,000 of it.
		switch {
		case a < 999.5:
			return fmt.Sprintf("%.0f ns", x)
		case a < 999.95e3:
			return fmt.Sprintf("%.1f µs", x/1e3)
		case a < 999.95e6:
			return fmt.Sprintf("%.1f ms", x/1e6)
		}
		return fmt.Sprintf("%.2f s", x/1e9)
	case suite.FormatCount:
		return strconv.FormatFloat(math.Round(x*10)/10, 'f', -1, 64)
	case suite.FormatRate:
		return suite.GroupDigits(int(math.Round(x))) + "/s"
	case suite.FormatBytes:
		return suite.GroupDigits(int(math.Round(x))) + " B"
	case suite.FormatShare:
		return fmt.Sprintf("%.1f%%", 100*x)
	}
	return fmt.Sprintf("%.2f", x)
}
