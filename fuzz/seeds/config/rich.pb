xπ

users-richapi.example.com*.example.org
/api/users"GET"POST*users2/users8B
users d(<Hà'R
10.0.0.0/8R::1/128Z10.1.2.3/32b$

x-envprod

x-tagax-debugj

cache-controlno-storer@
https://app.example.comGETauthorization"x-request-id(0ÿz
	users-hdr 
(2x-tenantí	Ë¯
ws/ws*usersÄà‡‘X
	dashboard
/dashboardÚ>
!
userusers/users/{rest} (Ù

ordersorders/orders
internal	/internal*users8"è
users
u-1http://127.0.0.1:8081
u-2http://[::1]:8082
/healthà'– ("êN(0:x-tenantJ"s3cret-s3cret-s3cret-s3cret-s3cret"!
ordersB
orders.internalê?à'Bz
cici-botservice"@aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa*gw_0123abcd22026-01-01T00:00:00Z