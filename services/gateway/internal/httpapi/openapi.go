package httpapi

import (
	_ "embed"
	"net/http"
)

// OpenAPI is the OpenAPI 3 document of the API, served at /v1/openapi.json.
//
//go:embed openapi.json
var OpenAPI []byte

func (a *API) openAPI(c *call) error {
	c.w.Header().Set("Cache-Control", "public, max-age=300")
	send(c.w, http.StatusOK, "application/json", OpenAPI)
	return nil
}
