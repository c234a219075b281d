package httpapi

import (
	_ "embed"
	"net/http"
)

// OpenAPI is the OpenAPI 3.1 document of the API, served at
// /v1/openapi.json. make gen writes it (tools/openapigen): the mapped
// routes and their messages from the protos, the rest from
// openapi.overlay.yaml.
//
//go:embed openapi.json
var OpenAPI []byte

func (a *API) openAPI(c *call) error {
	c.w.Header().Set("Cache-Control", "public, max-age=300")
	send(c.w, http.StatusOK, "application/json", OpenAPI)
	return nil
}
